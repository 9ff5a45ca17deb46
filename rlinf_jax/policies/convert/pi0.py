"""transformers' ``PaliGemmaForConditionalGeneration`` and ``PI0ForConditionalGeneration``
checkpoints -> ``policies.vla.paligemma.PaliGemma`` / ``policies.vla.pi0.Pi0``.

The same weights reach disk under several layouts, and all are read:

- PaliGemma: ``vision_tower.*`` (SigLIP, with or without ``vision_model.``),
  ``multi_modal_projector.linear.*`` and the Gemma under ``language_model.model.*``
  (``save_pretrained``, transformers 4 and 5) or ``model.language_model.*`` (transformers 5
  in memory, with ``model.`` before the vision tower and projector too);
- pi0: the lerobot / openpi layout that ``save_pretrained`` writes and the hub holds,
  ``paligemma_with_expert.paligemma.<a PaliGemma layout>``,
  ``paligemma_with_expert.gemma_expert.model.*`` and bare ``state_proj``, ``action_in_proj``,
  ``action_time_mlp_{in,out}``, ``action_out_proj``; or transformers' in-memory names,
  ``model.vlm.*``, ``model.dit.*``, ``embed_action_time.*``.

Gemma's rows are ``policies.lm.keymap``'s without their ``model.`` root. Skipped by name:
the action expert's token embeddings (``lm_head`` / ``embed_tokens``: it reads only action
embeddings) and PaliGemma's ``lm_head`` when the embeddings are also present (tied; a
checkpoint that saved only the head, as pi0's on the hub, fills the embeddings from it).
Everything else must fill a parameter, and every parameter must be filled; the RL heads
(value, flow-noise std), which no torch checkpoint has, start fresh.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
from flax import nnx

from rlinf_jax.policies.convert import keys, store
from rlinf_jax.policies.convert.keys import Row, Skip
from rlinf_jax.policies.convert.vision import SIGLIP_ROWS
from rlinf_jax.policies.lm import keymap as lm_keymap
from rlinf_jax.policies.lm.hf_checkpoint import (
    dotted,
    fill_model,
    open_safetensors,
    read_hf_config,
    safetensors_files,
)
from rlinf_jax.policies.vla.paligemma import PaliGemma, PaliGemmaConfig
from rlinf_jax.policies.vla.pi0 import Pi0, Pi0Config

# A Gemma decoder's rows relative to its root (``GemmaModel``): the LM key map minus the
# ``model.`` prefix and the output head.
GEMMA_ROWS = tuple(
    Row(r.hf.removeprefix("model."), r.ours, r.transform) for r in lm_keymap.KEY_MAP if r.hf.startswith("model.")
)
_PROJECTOR = (
    Row("weight", "projector.kernel", "T"),
    Row("bias", "projector.bias"),
)
# Where each part of a PaliGemma sits below its root, in each layout.
_VISION_AT = ("vision_tower.", "model.vision_tower.")
_PROJECTOR_AT = ("multi_modal_projector.linear.", "model.multi_modal_projector.linear.")
_TEXT_AT = ("language_model.model.", "model.language_model.", "model.language_model.model.", "language_model.")
_HEAD_AT = ("lm_head.weight", "language_model.lm_head.weight")
_ACTION_PROJ = ("state_proj", "action_in_proj", "action_time_mlp_in", "action_time_mlp_out")
RL_HEADS = ("value_head.", "noise_head.")
RL_HEADS_KEY = "rlinf_rl_heads"  # config.json entry recording the RL heads of a converted pi0


def paligemma_rows(root: str, ours: str, source_keys, tied: bool) -> tuple[tuple[Row, ...], tuple[Skip, ...]]:
    """(rows, skips) for a PaliGemma whose checkpoint keys start with ``root`` and whose
    parameters with ``ours``. ``source_keys`` decides how the tied head is read."""
    rows = []
    for at in _VISION_AT:
        rows += keys.prefixed(root + at, SIGLIP_ROWS, ours + "vision_tower.")
    for at in _PROJECTOR_AT:
        rows += keys.prefixed(root + at, _PROJECTOR, ours)
    for at in _TEXT_AT:
        rows += keys.prefixed(root + at, GEMMA_ROWS, ours + "language_model.")
    heads = [root + h for h in _HEAD_AT]
    skips = []
    if not tied:
        rows += [Row(h, ours + "language_model.lm_head.kernel", "T") for h in heads]
    elif any(k.startswith(root) and k.endswith("embed_tokens.weight") for k in source_keys):
        skips += [Skip(_exact(h), "output head tied to the token embeddings, which the checkpoint holds") for h in heads]
    else:
        rows += [Row(h, ours + "language_model.embed.embedding") for h in heads]
    return tuple(rows), tuple(skips)


def pi0_rows(source_keys, tied: bool) -> tuple[tuple[Row, ...], tuple[Skip, ...]]:
    """(rows, skips) for a pi0 checkpoint in either layout (module docstring)."""
    rows, skips = [], []
    for root in ("paligemma_with_expert.paligemma.", "model.vlm."):
        r, s = paligemma_rows(root, "paligemma.", source_keys, tied)
        rows += r
        skips += s
    for root in ("paligemma_with_expert.gemma_expert.model.", "model.dit."):
        rows += keys.prefixed(root, GEMMA_ROWS, "expert.")
    for name in _ACTION_PROJ:
        for src in (name, f"embed_action_time.{name}"):
            rows += [Row(f"{src}.weight", f"{name}.kernel", "T"), Row(f"{src}.bias", f"{name}.bias")]
    rows += [Row("action_out_proj.weight", "action_out_proj.kernel", "T"), Row("action_out_proj.bias", "action_out_proj.bias")]
    skips += [
        Skip(r"paligemma_with_expert\.gemma_expert\.(lm_head|model\.embed_tokens)\.weight", _EXPERT_EMBED),
        Skip(r"model\.dit\.embed_tokens\.weight", _EXPERT_EMBED),
    ]
    return tuple(rows), tuple(skips)


_EXPERT_EMBED = "the action expert reads only action embeddings: its token table is never used"


def _exact(key: str) -> str:
    return "".join("\\" + c if c in ".[]()*+?^$|{}\\" else c for c in key)


def _source_keys(files) -> list[str]:
    out = []
    for file in files:
        with open_safetensors(file) as f:
            out += list(f.keys())
    return out


def load_flow_model(model_fn, path, rows_fn, what, dtype, param_dtype, fresh=()):
    """Build ``model_fn(dtype, param_dtype, rngs)`` abstractly, pour the checkpoint in, and
    take parameters under the ``fresh`` prefixes from a real initialisation of those heads."""
    files = safetensors_files(path)
    graphdef, abstract_state = nnx.split(nnx.eval_shape(lambda: model_fn(dtype, param_dtype, nnx.Rngs(0))))
    targets = {dotted(p): v.get_value() for p, v in nnx.to_flat_state(abstract_state)}
    from_checkpoint = {k: v for k, v in targets.items() if not k.startswith(fresh)} if fresh else targets
    rows, skips = rows_fn(_source_keys(files))
    values = keys.read_checkpoint(files, rows, skips, from_checkpoint, what, dtype=param_dtype)
    values = {k: jnp.asarray(v) for k, v in values.items()}
    if len(from_checkpoint) < len(targets):
        values.update(_fresh_heads(model_fn, dtype, param_dtype, fresh))
    return fill_model(graphdef, abstract_state, values)


def _fresh_heads(model_fn, dtype, param_dtype, prefixes, seed: int = 0) -> dict:
    """Freshly initialised parameters of the small heads under ``prefixes``: the model is
    built abstractly and only the heads' own initialisers run."""
    model = nnx.eval_shape(lambda: model_fn(dtype, param_dtype, nnx.Rngs(seed)))
    out = {}
    for prefix in prefixes:
        head = getattr(model, prefix.rstrip("."))
        if head is None:
            continue
        # Re-create the head alone, concretely, with the same constructor arguments.
        concrete = type(head)(
            head.sizes, head.activation, dtype=dtype, param_dtype=param_dtype, rngs=nnx.Rngs(seed)
        )
        for p, v in nnx.to_flat_state(nnx.state(concrete, nnx.Param)):
            out[prefix + dotted(p)] = v.get_value()
    return out


# -- PaliGemma -------------------------------------------------------------------------


def paligemma_from_pretrained(path, dtype=jnp.float32, param_dtype=None) -> PaliGemma:
    """A ``PaliGemma`` from a local ``PaliGemmaForConditionalGeneration`` directory."""
    config = PaliGemmaConfig.from_hf_config(read_hf_config(path))
    param_dtype = param_dtype or dtype
    tied = config.text.tie_word_embeddings
    return load_flow_model(
        lambda d, pd, rngs: PaliGemma(config, dtype=d, param_dtype=pd, rngs=rngs),
        path,
        lambda source: paligemma_rows("", "", source, tied),
        "PaliGemma",
        dtype,
        param_dtype,
    )


def convert_paligemma(src, out_dir, dtype="auto") -> Path:
    store.check_empty(out_dir)
    model = paligemma_from_pretrained(src, dtype=store.resolve_dtype(read_hf_config(src), dtype))
    return store.save_converted(model, src, out_dir)


def load_paligemma(path, dtype=None) -> PaliGemma:
    def build(hf, d, pd):
        return PaliGemma(PaliGemmaConfig.from_hf_config(hf), dtype=d, param_dtype=pd, rngs=nnx.Rngs(0))

    return store.load_converted(path, build, dtype)


# -- pi0 -------------------------------------------------------------------------------


def pi0_config(hf: dict, **rl) -> Pi0Config:
    """The ``Pi0Config`` of a config.json, with the RL heads it records (or ``rl``)."""
    recorded = {k: tuple(v) for k, v in hf.get(RL_HEADS_KEY, {}).items()}
    return Pi0Config.from_hf_config(hf, **{**recorded, **rl})


def from_pretrained(path, dtype=jnp.float32, param_dtype=None, **rl) -> Pi0:
    """A ``Pi0`` from a local ``PI0ForConditionalGeneration`` directory; ``rl`` adds fresh RL
    heads (``value_hidden``, ``noise_hidden``, ``noise_std_range``)."""
    config = pi0_config(read_hf_config(path), **rl)
    param_dtype = param_dtype or dtype
    tied = config.paligemma.text.tie_word_embeddings
    return load_flow_model(
        lambda d, pd, rngs: Pi0(config, dtype=d, param_dtype=pd, rngs=rngs),
        path,
        lambda source: pi0_rows(source, tied),
        "pi0",
        dtype,
        param_dtype,
        fresh=RL_HEADS,
    )


def convert(src, out_dir, dtype="auto", **rl) -> Path:
    """``PI0ForConditionalGeneration`` directory ``src`` -> converted directory ``out_dir``;
    RL heads asked for in ``rl`` are initialised fresh and recorded in its config.json."""
    return convert_flow_model(from_pretrained, src, out_dir, dtype, **rl)


def convert_flow_model(from_pretrained_fn, src, out_dir, dtype="auto", **rl) -> Path:
    """Convert with ``from_pretrained_fn(src, dtype=..., **rl)`` and save, recording the RL
    heads asked for in the written config.json (pi0's and pi0.5's converters)."""
    store.check_empty(out_dir)
    hf = read_hf_config(src)
    model = from_pretrained_fn(src, dtype=store.resolve_dtype(hf, dtype), **rl)
    c = model.config
    heads = {"value_hidden": c.value_hidden, "noise_hidden": c.noise_hidden, "noise_std_range": c.noise_std_range}
    recorded = {k: list(v) for k, v in heads.items()} if (c.value_hidden or c.noise_hidden) else None
    hf_out = json.loads(json.dumps(hf)) if recorded is None else {**hf, RL_HEADS_KEY: recorded}
    return store.save_converted(model, src, out_dir, hf_config=hf_out)


def load(path, dtype=None) -> Pi0:
    """The ``Pi0`` written by ``convert`` (RL heads as its config.json records)."""

    def build(hf, d, pd):
        return Pi0(pi0_config(hf), dtype=d, param_dtype=pd, rngs=nnx.Rngs(0))

    return store.load_converted(path, build, dtype)


__all__ = [
    "GEMMA_ROWS",
    "convert",
    "convert_flow_model",
    "convert_paligemma",
    "from_pretrained",
    "load",
    "load_flow_model",
    "load_paligemma",
    "paligemma_from_pretrained",
    "paligemma_rows",
    "pi0_rows",
]
