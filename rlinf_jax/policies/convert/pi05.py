"""pi0.5 checkpoints (openpi's torch port, as lerobot saves and the hub holds them) ->
``policies.vla.pi05.Pi05``.

The config.json is lerobot's ``PI05Config`` (``"type": "pi05"``, `Pi05Config.from_lerobot_config`).
The weights are ``PI05Pytorch``'s, with or without the ``model.`` a saved policy puts before
them: ``paligemma_with_expert.paligemma.<a PaliGemma layout>`` (pi0's rows),
``paligemma_with_expert.gemma_expert.model.*`` (Gemma's rows, whose norms are adaptive:
``*_layernorm.dense.*`` and ``norm.dense.*``), and ``action_in_proj``, ``time_mlp_{in,out}``,
``action_out_proj``. Skipped by name: the expert's token table and output head (it reads
only action embeddings); PaliGemma's head fills its tied embeddings when the checkpoint kept
only the head (lerobot saves tied tensors once). Everything else must fill a parameter and
every parameter must be filled; the RL heads start fresh, as pi0's do.
"""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
from flax import nnx

from rlinf_jax.policies.convert import keys, store
from rlinf_jax.policies.convert.keys import Row, Skip
from rlinf_jax.policies.convert.pi0 import (
    GEMMA_ROWS,
    RL_HEADS,
    RL_HEADS_KEY,
    convert_flow_model,
    load_flow_model,
    paligemma_rows,
)
from rlinf_jax.policies.lm.hf_checkpoint import read_hf_config
from rlinf_jax.policies.vla.pi05 import Pi05, Pi05Config

_ROOTS = ("", "model.")  # PI05Pytorch's own keys, or a saved policy's
_PROJECTIONS = ("action_in_proj", "time_mlp_in", "time_mlp_out", "action_out_proj")
_EXPERT_EMBED = "the action expert reads only action embeddings: its token table and head are never used"


def pi05_rows(source_keys, tied: bool) -> tuple[tuple[Row, ...], tuple[Skip, ...]]:
    """(rows, skips) for a pi0.5 checkpoint (module docstring)."""
    rows, skips = [], []
    for root in _ROOTS:
        r, s = paligemma_rows(root + "paligemma_with_expert.paligemma.", "paligemma.", source_keys, tied)
        rows += r
        skips += s
        rows += keys.prefixed(root + "paligemma_with_expert.gemma_expert.model.", GEMMA_ROWS, "expert.")
        for name in _PROJECTIONS:
            rows += [Row(f"{root}{name}.weight", f"{name}.kernel", "T"), Row(f"{root}{name}.bias", f"{name}.bias")]
    skips.append(Skip(r"(model\.)?paligemma_with_expert\.gemma_expert\.(lm_head|model\.embed_tokens)\.weight",
                      _EXPERT_EMBED))
    return tuple(rows), tuple(skips)


def pi05_config(hf: dict, **rl) -> Pi05Config:
    """The ``Pi05Config`` of a config.json, with the RL heads it records (or ``rl``)."""
    recorded = {k: tuple(v) for k, v in hf.get(RL_HEADS_KEY, {}).items()}
    return Pi05Config.from_lerobot_config(hf, **{**recorded, **rl})


def from_pretrained(path, dtype=jnp.float32, param_dtype=None, **rl) -> Pi05:
    """A ``Pi05`` from a local pi0.5 directory; ``rl`` adds fresh RL heads (``value_hidden``,
    ``noise_hidden``, ``noise_std_range``)."""
    config = pi05_config(read_hf_config(path), **rl)
    tied = config.paligemma.text.tie_word_embeddings
    return load_flow_model(
        lambda d, pd, rngs: Pi05(config, dtype=d, param_dtype=pd, rngs=rngs),
        path,
        lambda source: pi05_rows(source, tied),
        "pi0.5",
        dtype,
        param_dtype or dtype,
        fresh=RL_HEADS,
    )


def convert(src, out_dir, dtype="auto", **rl) -> Path:
    """pi0.5 directory ``src`` -> converted directory ``out_dir``; RL heads asked for in
    ``rl`` are initialised fresh and recorded in its config.json. ``"auto"`` keeps float32:
    lerobot's ``dtype`` key names the precision it computes in, not the one it saved (and
    openpi keeps the norms float32 even when computing in bfloat16)."""
    return convert_flow_model(from_pretrained, src, out_dir, "float32" if dtype in (None, "auto") else dtype, **rl)


def load(path, dtype=None) -> Pi05:
    """The ``Pi05`` written by ``convert`` (RL heads as its config.json records)."""

    def build(hf, d, pd):
        return Pi05(pi05_config(hf), dtype=d, param_dtype=pd, rngs=nnx.Rngs(0))

    return store.load_converted(path, build, dtype)
