"""Instructions as token ids: a fixed word vocabulary over every template and name.

The vocabulary covers the test splits' words too (an unseen paraphrase is made of ids the
policy never trained on, not of unknown-word ids), so a checkpoint's embedding table has
one size for every split. Policies with their own language-model tokenizer take the text
from `instruction` (host side) instead.

Every (template, object, target) sentence is tokenized once into a table, so the jitted
env looks an instruction up by three indices.
"""

from __future__ import annotations

import functools

import numpy as np

from rlinf_jax.envs.tabletop import catalog

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
MAX_TOKENS = 16  # <bos> + the longest sentence (13 words) + <eos>, with room to spare


@functools.lru_cache(maxsize=1)
def vocabulary() -> tuple[str, ...]:
    words: set[str] = set()
    for t in range(len(catalog.TEMPLATES)):
        for o in range(len(catalog.OBJECTS)):
            for g in range(len(catalog.PAD_NAMES)):
                words.update(catalog.instruction_text(t, o, g).split())
    return SPECIALS + tuple(sorted(words))


def vocab_size() -> int:
    return len(vocabulary())


def encode(text: str, max_tokens: int = MAX_TOKENS) -> np.ndarray:
    """<bos> words <eos>, right-padded with <pad> to `max_tokens` (int32)."""
    index = {w: i for i, w in enumerate(vocabulary())}
    ids = [BOS] + [index.get(w, UNK) for w in text.lower().split()] + [EOS]
    if len(ids) > max_tokens:
        raise ValueError(f"instruction needs {len(ids)} tokens, more than max_tokens={max_tokens}")
    return np.array(ids + [PAD] * (max_tokens - len(ids)), np.int32)


def decode(ids) -> str:
    """The words of a token row, without specials; ids past the vocabulary read as <unk>."""
    vocab = vocabulary()
    words = []
    for i in np.asarray(ids).reshape(-1).tolist():
        if i == EOS:
            break
        if i in (PAD, BOS):
            continue
        words.append(vocab[i] if 0 <= i < len(vocab) else SPECIALS[UNK])
    return " ".join(words)


@functools.lru_cache(maxsize=1)
def token_table() -> np.ndarray:
    """int32 [templates, objects, targets, MAX_TOKENS]."""
    nt, no, ng = len(catalog.TEMPLATES), len(catalog.OBJECTS), len(catalog.PAD_NAMES)
    table = np.zeros((nt, no, ng, MAX_TOKENS), np.int32)
    for t in range(nt):
        for o in range(no):
            for g in range(ng):
                table[t, o, g] = encode(catalog.instruction_text(t, o, g))
    return table
