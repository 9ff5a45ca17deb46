"""One entry point for the tokenizer of a run: the built-in character tokenizer or a model
directory's own."""

from __future__ import annotations

from pathlib import Path

from rlinf_jax.data.char_tokenizer import CharTokenizer
from rlinf_jax.data.hf_tokenizer import load_tokenizer
from rlinf_jax.errors import BadInput

# The files a Hugging Face model directory keeps its tokenizer in (`load_tokenizer` reads
# tokenizer.json; a directory with only the others is told how to write it).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


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
            f"the tokenizer ({spec}) has {len(tok)} ids but the model's vocabulary holds {vocab_size}, so "
            "some ids have no embedding; set data.tokenizer to the tokenizer the model was trained with "
            "(a fresh model: a larger actor.model.lm.vocab_size)"
        )
    return tok


def carried_tokenizer(model_path: str) -> str | None:
    """``model_path`` when it is a model directory (``config.json``: Hugging Face or
    converted) that carries its own tokenizer, else None."""
    if not model_path:
        return None
    d = Path(model_path)
    if not (d / "config.json").is_file():
        return None
    return model_path if any((d / name).is_file() for name in TOKENIZER_FILES) else None
