"""Tokenizers from local model directories, without the class guessing of ``AutoTokenizer``.

``AutoTokenizer`` follows ``tokenizer_config.json``'s ``tokenizer_class``; in transformers 5
that can rebuild a checkpoint's custom tokenizer as, say, ``Qwen2Tokenizer`` from its vocab
and drop its pre-tokenizer (spaces vanish on decode). ``tokenizer.json`` is the tokenizer
exactly as trained, so we load that and only wrap it for the conveniences (padding, special
tokens, chat templates) of ``PreTrainedTokenizerFast``.
"""

from __future__ import annotations

from pathlib import Path

from rlinf_jax.errors import BadInput


def load_tokenizer(path):
    """A ``transformers.PreTrainedTokenizerFast`` for the directory's ``tokenizer.json``."""
    d = Path(path)
    if not (d / "tokenizer.json").is_file():
        raise BadInput(
            f"{d} has no tokenizer.json; save the tokenizer there with "
            "tokenizer.save_pretrained(dir) (fast tokenizers write tokenizer.json)"
        )
    from transformers import PreTrainedTokenizerFast  # heavy: imported only for model directories

    # from_pretrained on the concrete class reads tokenizer_config.json for special tokens and
    # the chat template but keeps tokenizer.json's pipeline intact.
    tok = PreTrainedTokenizerFast.from_pretrained(str(d), local_files_only=True)
    # Prompts are left-padded for generation; the model's positions follow the mask either way.
    tok.padding_side = "left"
    if tok.pad_token is None and tok.eos_token is not None:
        # Batched prompts need a pad id; left padding is masked out, so reusing eos is safe.
        tok.pad_token = tok.eos_token
    return tok
