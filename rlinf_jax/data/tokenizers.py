"""One entry point for the tokenizer of a run: the built-in character tokenizer or a model
directory's own."""

from __future__ import annotations

from rlinf_jax.data.char_tokenizer import CharTokenizer


def get_tokenizer(spec: str):
    """``"char"`` -> ``CharTokenizer()``; anything else is a local model directory whose
    ``tokenizer.json`` ``rlinf_jax.policies.lm.load_tokenizer`` loads (left padding)."""
    if spec == "char":
        return CharTokenizer()
    from rlinf_jax.policies.lm.tokenizer import load_tokenizer

    return load_tokenizer(spec)
