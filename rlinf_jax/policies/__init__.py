"""Policies: Flax NNX models (``mlp`` for control, ``lm`` for language models).

The LM entry points are imported on first use so that ``import rlinf_jax.policies.mlp`` does
not pull in Orbax, safetensors or the LM code.
"""

_LM_EXPORTS = ("from_pretrained", "save_pretrained", "load_converted", "load_tokenizer")

__all__ = list(_LM_EXPORTS)


def __getattr__(name):
    if name in _LM_EXPORTS:
        from rlinf_jax.policies import lm

        return getattr(lm, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
