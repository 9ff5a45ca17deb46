"""The language model of an sft / reasoning run: where ``actor.model`` says its weights come
from, and what its checkpoints record so that a later run can load it again.

``actor.model.path``:

- ``""``: a fresh model of the ``actor.model.lm_*`` sizes (the offline tiny character model);
- a run folder or checkpoint of an sft / reasoning run: its policy parameters, with the
  architecture read from the checkpoint's metadata (``lm_config``); LoRA adapters are
  merged into the base;
- a converted directory (``config.json`` + ``params/``) or a Hugging Face directory
  (``config.json`` + safetensors).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from rlinf_jax.config.schema import Config, PolicyConfig
from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm import CausalLM, LMConfig, from_pretrained, load_converted, set_matmul
from rlinf_jax.policies.lm.hf_checkpoint import abstract_model, dotted, fill_model, flatten_tree, parse_dtype
from rlinf_jax.policies.lm.lora import merge_host
from rlinf_jax.runtime import Checkpointer, find_checkpoint

# Checkpoint metadata key holding the model's Hugging Face config dict.
LM_CONFIG_KEY = "lm_config"


def lm_config_from(m: PolicyConfig) -> LMConfig:
    """The architecture of a fresh model from ``actor.model.lm_*``, read as a Hugging Face
    config would be (so a family's fixed switches, e.g. Qwen2's q/k/v biases, hold and the
    checkpoint's ``lm_config`` reads back to the same model)."""
    return LMConfig.from_hf_config({
        "model_type": m.lm_model_type,
        "vocab_size": m.lm_vocab_size,
        "hidden_size": m.lm_hidden_size,
        "intermediate_size": m.lm_intermediate_size,
        "num_hidden_layers": m.lm_num_layers,
        "num_attention_heads": m.lm_num_heads,
        "num_key_value_heads": m.lm_num_kv_heads,
        "head_dim": m.lm_hidden_size // m.lm_num_heads,
        "tie_word_embeddings": m.lm_tie_word_embeddings,
        "max_position_embeddings": m.lm_max_position_embeddings,
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
    return LoadedLM(with_settings(loaded.model, param_dtype, m.matmul), loaded.source)


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
        model = CausalLM(lm_config_from(m), dtype=dtype, param_dtype=param_dtype, rngs=nnx.Rngs(seed))
        return LoadedLM(model, f"fresh {m.lm_model_type} model (seed {seed})")
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
            return LoadedLM(load_converted(path, dtype=dtype), f"converted model {path}")
        return LoadedLM(from_pretrained(path, dtype=dtype, param_dtype=param_dtype), f"Hugging Face model {path}")
    model, point = load_checkpoint_policy(path, dtype)
    return LoadedLM(model, f"checkpoint {point.path}")


def load_checkpoint_policy(path, dtype=None):
    """The policy of an sft / reasoning run's checkpoint (run folder, checkpoints folder or
    step folder); returns ``(model, ResumePoint)``."""
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
    if "lora" in state["params"] and "lora" in meta:
        stored = merge_host(stored, flatten_tree(state["params"]["lora"]), meta["lora"])
    dtype = parse_dtype(dtype) if dtype is not None else jnp.dtype(next(iter(stored.values())).dtype)
    graphdef, abstract = nnx.split(abstract_model(config, dtype, dtype))
    wanted = {dotted(p) for p, _ in nnx.to_flat_state(abstract)}
    if set(stored) != wanted:
        missing = sorted(wanted - set(stored))[:3]
        raise BadInput(f"checkpoint {point.path} does not match its lm_config (missing {', '.join(missing)})")
    values = {k: jnp.asarray(v, dtype) for k, v in stored.items()}
    return fill_model(graphdef, abstract, values), point


def checkpoint_meta(model: CausalLM, tokenizer_spec: str) -> dict:
    """What an LM checkpoint's metadata needs so that a later run can load its policy."""
    return {LM_CONFIG_KEY: model.config.to_hf_config(jnp.dtype(model.param_dtype).name), "tokenizer": tokenizer_spec}
