"""One entry point for the tokenizer of a run: the built-in character tokenizer or a model
directory's own."""

from __future__ import annotations

from rlinf_jax.data.char_tokenizer import CharTokenizer
from rlinf_jax.data.hf_tokenizer import load_tokenizer
from rlinf_jax.errors import BadInput


def get_tokenizer(spec: str):
    """``"char"`` -> ``CharTokenizer()``; anything else is a local model directory whose
    ``tokenizer.json`` `load_tokenizer` loads (left padding)."""
    if spec == "char":
        return CharTokenizer()
    return load_tokenizer(spec)


def run_tokenizer(spec: str, vocab_size: int | None = None):
    """`get_tokenizer`, refused when it has more ids than the model's vocabulary."""
    tok = get_tokenizer(spec)
    if vocab_size is not None and len(tok) > vocab_size:
        raise BadInput(
            f"the tokenizer ({spec}) has {len(tok)} ids but the model's vocabulary holds {vocab_size}; "
            "use the model's own tokenizer (data.tokenizer) or a larger actor.model.lm_vocab_size"
        )
    return tok
