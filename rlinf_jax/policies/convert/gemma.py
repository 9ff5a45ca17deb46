"""Gemma (transformers ``GemmaForCausalLM``) -> a converted Flax directory.

Gemma is one more family of ``rlinf_jax.policies.lm``: its checkpoint keys are Llama's
(``model.layers.{i}.self_attn.q_proj.weight`` ...), so the rows of ``lm.keymap`` read it as
they are, and what differs (``1 + scale`` norms, scaled embeddings, tanh-GELU) is the
architecture, not the key map. The norm weights are stored as the checkpoint has them
(around 0); the model adds the 1. Tied checkpoints carry no ``lm_head.weight``; one that does
is skipped by name (the tie wins), every other key must find its parameter.
"""

from __future__ import annotations

from pathlib import Path

from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm.converted import convert as convert_lm
from rlinf_jax.policies.lm.converted import load_converted as load
from rlinf_jax.policies.lm.hf_checkpoint import read_hf_config


def convert(src, out_dir, dtype: str = "auto") -> Path:
    """Local ``GemmaForCausalLM`` directory ``src`` -> ``out_dir`` (Orbax params + config.json);
    read it back with ``rlinf_jax.policies.lm.load_converted``."""
    model_type = read_hf_config(src).get("model_type")
    if model_type != "gemma":
        raise BadInput(
            f"{src} holds a {model_type!r} model, not 'gemma'; pick the converter for {model_type!r}"
        )
    return convert_lm(src, out_dir, dtype)


__all__ = ["convert", "load"]
