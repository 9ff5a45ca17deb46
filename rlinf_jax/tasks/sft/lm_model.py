"""The language model of an sft / reasoning run: where ``actor.model`` says its weights come
from, and what its checkpoints record so that a later run can load it again.

``actor.model.path``:

- ``""``: a fresh model of the ``actor.model.lm.*`` sizes (the offline tiny character model);
- a run folder or checkpoint of an sft / reasoning run: its policy parameters, with the
  architecture read from the checkpoint's metadata (``lm_config``), in either layout of the
  blocks whatever the run trained with (``actor.model.scan_layers``); LoRA adapters are
  merged into the base (a QLoRA run's NF4 base dequantised first);
- a converted directory (``config.json`` + ``params/``) or a Hugging Face directory
  (``config.json`` + safetensors).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from rlinf_jax.config.schema import Config, PolicyConfig
from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm import CausalLM, LMConfig, from_pretrained, load_converted, set_matmul
from rlinf_jax.policies.lm.hf_checkpoint import abstract_model, dotted, fill_model, flatten_tree, parse_dtype
from rlinf_jax.policies.lm import layout
from rlinf_jax.policies.lm.lora import merge_host
from rlinf_jax.policies.lm.published import PUBLISHED, published_config
from rlinf_jax.policies.lm.qlora import dequantize_flat
from rlinf_jax.runtime import Checkpointer, ResumePoint, find_checkpoint

# Checkpoint metadata key holding the model's Hugging Face config dict.
LM_CONFIG_KEY = "lm_config"
# ... and whether its blocks are stacked for a scan (`policies.lm.layout`).
LM_SCANNED_KEY = "lm_scan_layers"


def lm_config_from(m: PolicyConfig) -> LMConfig:
    """The architecture of a fresh model from ``actor.model.lm.*``, read as a Hugging Face
    config would be (so a family's fixed switches, e.g. Qwen2's q/k/v biases, hold and the
    checkpoint's ``lm_config`` reads back to the same model)."""
    return LMConfig.from_hf_config({
        "model_type": m.lm.model_type,
        "vocab_size": m.lm.vocab_size,
        "hidden_size": m.lm.hidden_size,
        "intermediate_size": m.lm.intermediate_size,
        "num_hidden_layers": m.lm.num_layers,
        "num_attention_heads": m.lm.num_heads,
        "num_key_value_heads": m.lm.num_kv_heads,
        "head_dim": m.lm.hidden_size // m.lm.num_heads,
        "tie_word_embeddings": m.lm.tie_word_embeddings,
        "max_position_embeddings": m.lm.max_position_embeddings,
        "rms_norm_eps": 1e-6,
    })


@dataclasses.dataclass
class LoadedLM:
    model: CausalLM
    source: str  # where the weights came from, for people


def load_policy(cfg: Config, seed: int | None = None) -> LoadedLM:
    """The model ``actor.model`` describes, on the default device (callers lay it out), its
    parameters stored in ``param_dtype`` and its products through the ``matmul`` backend."""
    m = cfg.actor.model
    dtype = parse_dtype(m.dtype)
    param_dtype = parse_dtype(m.param_dtype) if m.param_dtype else dtype
    loaded = _load(cfg, m, dtype, param_dtype, seed)
    model = with_settings(loaded.model, param_dtype, m.matmul)
    model.remat = m.remat  # a static setting of the traced program: no weights change
    return LoadedLM(model, loaded.source)


def with_settings(model: CausalLM, param_dtype, matmul: str) -> CausalLM:
    """``model`` with its parameters in ``param_dtype`` and its products through ``matmul``."""
    if jnp.dtype(model.param_dtype) != param_dtype:
        graphdef, state = nnx.split(model)
        model = nnx.merge(graphdef, jax.tree.map(lambda x: x.astype(param_dtype), state))
        model.param_dtype = param_dtype
    set_matmul(model, matmul)
    return model


def _load(cfg: Config, m: PolicyConfig, dtype, param_dtype, seed) -> LoadedLM:
    if not m.path:
        seed = cfg.runner.seed if seed is None else seed
        model = CausalLM(
            lm_config_from(m), dtype=dtype, param_dtype=param_dtype, rngs=nnx.Rngs(seed), scan_layers=m.scan_layers
        )
        return LoadedLM(model, f"fresh {m.lm.model_type} model (seed {seed})")
    path = Path(m.path)
    if not path.exists():
        # Checked here rather than when the config loads, so recipes can name a model
        # directory that only exists on the machine that trains.
        raise BadInput(
            f"actor.model.path={m.path!r}: no such path; give a run folder, a checkpoint, a Hugging Face model "
            'directory or a converted directory, or "" for a fresh tiny model'
        )
    if path.is_dir() and (path / "config.json").is_file():
        if (path / "params").is_dir():
            return LoadedLM(load_converted(path, dtype=dtype, scan_layers=m.scan_layers), f"converted model {path}")
        model = from_pretrained(path, dtype=dtype, param_dtype=param_dtype, scan_layers=m.scan_layers)
        return LoadedLM(model, f"Hugging Face model {path}")
    model, point = load_checkpoint_policy(path, dtype, scan_layers=m.scan_layers)
    return LoadedLM(model, f"checkpoint {point.path}")


def load_checkpoint_policy(path, dtype=None, scan_layers: bool | None = None):
    """The policy of an sft / reasoning run's checkpoint (run folder, checkpoints folder or
    step folder); returns ``(model, ResumePoint)``. ``scan_layers`` is the layout wanted
    (None: the one the run trained with); the stored one is converted to it."""
    point = find_checkpoint(path, "actor.model.path")
    with Checkpointer(point.directory) as ckpt:
        state, meta = ckpt.restore(point.step, None)
    hf = meta.get(LM_CONFIG_KEY)
    if not isinstance(hf, dict) or not isinstance(state, dict) or "params" not in state:
        raise BadInput(
            f"checkpoint {point.path} holds no language model (no {LM_CONFIG_KEY} in its metadata); "
            "point actor.model.path at an sft or reasoning run, or a Hugging Face model directory"
        )
    config = LMConfig.from_hf_config(hf)
    policy = state["params"].get("policy", state["params"])  # {"policy", "value", "lora"} in LM runs
    # A saved nnx.State names each array ``<path>.value`` (the Variable's field).
    stored = {k.removesuffix(".value"): v for k, v in flatten_tree(policy).items()}
    if meta.get("lora", {}).get("base_qtype", "none") != "none":
        stored = dequantize_flat(stored)  # a QLoRA run's NF4 base
    if "lora" in state["params"] and "lora" in meta:
        stored = merge_host(stored, flatten_tree(state["params"]["lora"]), meta["lora"])
    dtype = parse_dtype(dtype) if dtype is not None else jnp.dtype(next(iter(stored.values())).dtype)
    stacked = layout.is_stacked(stored)  # adapters are merged first, in the layout they were trained in
    if scan_layers is None:
        scan_layers = stacked
    elif scan_layers and not stacked:
        stored = layout.stack_flat(stored, config.num_layers)
    elif stacked and not scan_layers:
        stored = layout.unstack_flat(stored)
    graphdef, abstract = nnx.split(abstract_model(config, dtype, dtype, scan_layers=scan_layers))
    wanted = {dotted(p) for p, _ in nnx.to_flat_state(abstract)}
    if set(stored) != wanted:
        missing = sorted(wanted - set(stored))[:3]
        raise BadInput(f"checkpoint {point.path} does not match its lm_config (missing {', '.join(missing)})")
    values = {k: jnp.asarray(v, dtype) for k, v in stored.items()}
    return fill_model(graphdef, abstract, values), point


def checkpoint_meta(model: CausalLM, tokenizer_spec: str) -> dict:
    """What an LM checkpoint's metadata needs so that a later run can load its policy, and
    the layout of its blocks (a resume must train in the same one)."""
    return {
        LM_CONFIG_KEY: model.config.to_hf_config(jnp.dtype(model.param_dtype).name),
        "tokenizer": tokenizer_spec,
        LM_SCANNED_KEY: model.scan_layers,
    }


def check_resume_layout(cfg: Config, point: ResumePoint | None) -> None:
    """Refuses to resume a run whose checkpoint holds its blocks in the other layout than
    ``actor.model.scan_layers`` (its optimiser state is laid out the same way); read from the
    checkpoint's metadata before any array. Checkpoints from before the setting are unrolled."""
    if point is None or not point.looks_saved():
        return
    with Checkpointer(point.directory) as ckpt:
        meta = ckpt.read_meta(point.step)
    if LM_CONFIG_KEY not in meta:
        return  # not a language model's checkpoint: the restore says what is wrong
    saved = bool(meta.get(LM_SCANNED_KEY, False))
    if saved != cfg.actor.model.scan_layers:
        raise BadInput(
            f"checkpoint {point.path} was trained with actor.model.scan_layers={str(saved).lower()}; resume with "
            f"that setting, or start a new run from it with actor.model.path={point.path} (its weights load "
            "into either layout)"
        )


def lm_architecture(cfg: Config) -> LMConfig:
    """The architecture ``actor.model`` names, read without loading a weight: a fresh model's
    ``lm.*`` sizes; a model directory's ``config.json``; a run's checkpoint's ``lm_config``;
    and where the path does not exist here, the published architecture its folder name
    names (`policies.lm.published`). For planning a run on hardware this machine lacks."""
    m = cfg.actor.model
    if not m.path:
        return lm_config_from(m)
    path = Path(m.path)
    if path.is_dir() and (path / "config.json").is_file():
        try:
            hf = json.loads((path / "config.json").read_text())
        except (OSError, ValueError) as e:
            raise BadInput(f"{path / 'config.json'} is unreadable ({e})") from None
        return LMConfig.from_hf_config(hf)
    if path.exists():
        point = find_checkpoint(path, "actor.model.path")
        with Checkpointer(point.directory) as ckpt:
            meta = ckpt.read_meta(point.step)
        if isinstance(meta.get(LM_CONFIG_KEY), dict):
            return LMConfig.from_hf_config(meta[LM_CONFIG_KEY])
        raise BadInput(f"checkpoint {point.path} holds no language model (no {LM_CONFIG_KEY} in its metadata)")
    hf = published_config(m.path)
    if hf is None:
        known = ", ".join(sorted(PUBLISHED))
        raise BadInput(
            f"actor.model.path={m.path!r} is not here and its name is not a published model this project knows "
            f"({known}); point it at a directory with the model's config.json"
        )
    return LMConfig.from_hf_config(hf)
