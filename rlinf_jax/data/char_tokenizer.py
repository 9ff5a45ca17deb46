"""A character-level tokenizer for the offline tiny language model.

The default reasoning recipe trains a ~3M-parameter model from scratch on arithmetic; a real
BPE vocabulary would waste most of its parameters on embeddings it never sees, and a checkpoint
directory would be a download. One token per printable ASCII character keeps the vocabulary at
100 and makes every digit its own token, which is what arithmetic wants.

The surface follows the ``transformers`` tokenizer that ``rlinf_jax.data.load_tokenizer``
returns (``encode``, ``decode``, ``batch_decode``, ``__call__`` with left padding, the
``*_token_id`` attributes), so the trainer and the sampler can take either.
"""

from __future__ import annotations

import numpy as np

from rlinf_jax.errors import BadInput

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
# Newline, then every printable ASCII character (space through tilde): digits, operators,
# letters, punctuation, and the backslash and braces of \boxed{}.
CHARACTERS = "\n" + "".join(chr(c) for c in range(32, 127))


class CharTokenizer:
    """Fixed vocabulary: ids 0-3 are pad, bos, eos, unk; then one id per character.

    Characters outside the vocabulary encode to unk (and so do not round-trip).
    """

    padding_side = "left"
    truncation_side = "left"
    chat_template = None

    def __init__(self):
        self._tokens = list(SPECIAL_TOKENS) + list(CHARACTERS)
        self._ids = {c: i + len(SPECIAL_TOKENS) for i, c in enumerate(CHARACTERS)}
        self.pad_token, self.bos_token, self.eos_token, self.unk_token = SPECIAL_TOKENS
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = range(len(SPECIAL_TOKENS))

    # The names transformers uses, so code written against either tokenizer works.
    @property
    def pad_token_id(self) -> int:
        return self.pad_id

    @property
    def bos_token_id(self) -> int:
        return self.bos_id

    @property
    def eos_token_id(self) -> int:
        return self.eos_id

    @property
    def unk_token_id(self) -> int:
        return self.unk_id

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    def get_vocab(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(self._tokens)}

    def convert_ids_to_tokens(self, ids):
        if isinstance(ids, (int, np.integer)):
            return self._tokens[int(ids)]
        return [self._tokens[int(i)] for i in ids]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` prepends bos (the model's start)."""
        ids = [self._ids.get(c, self.unk_id) for c in text]
        return [self.bos_id, *ids] if add_special_tokens else ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        out = []
        for i in np.asarray(ids, dtype=np.int64).reshape(-1).tolist():
            # A model whose embedding is padded past the vocabulary can sample such ids; they
            # read as unk rather than stopping the run.
            i = i if 0 <= i < len(self._tokens) else self.unk_id
            if i < len(SPECIAL_TOKENS) and skip_special_tokens:
                continue
            out.append(self._tokens[i])
        return "".join(out)

    def batch_decode(self, sequences, skip_special_tokens: bool = False) -> list[str]:
        return [self.decode(s, skip_special_tokens=skip_special_tokens) for s in sequences]

    def batch_encode(self, texts, max_length: int | None = None, add_special_tokens: bool = True):
        """``(ids [B, T] int32, attention_mask [B, T] int32)``, left-padded with pad.

        T is the longest sequence, or ``max_length``; longer sequences lose their left end
        (generation continues from the right end, so that is the part to keep).
        """
        seqs = [self.encode(t, add_special_tokens=add_special_tokens) for t in texts]
        width = max((len(s) for s in seqs), default=0) if max_length is None else int(max_length)
        ids = np.full((len(seqs), width), self.pad_id, np.int32)
        mask = np.zeros((len(seqs), width), np.int32)
        for row, s in enumerate(seqs):
            s = s[len(s) - width :] if len(s) > width else s
            if s:
                ids[row, width - len(s) :] = s
                mask[row, width - len(s) :] = 1
        return ids, mask

    def __call__(
        self,
        text,
        padding=False,
        truncation: bool = False,
        max_length: int | None = None,
        return_tensors: str | None = None,
        add_special_tokens: bool = True,
    ):
        """``{"input_ids", "attention_mask"}`` like a transformers tokenizer.

        A single string gives flat lists. For a batch, ``padding=True`` (or ``"longest"``) pads
        on the left to the longest, ``"max_length"`` to ``max_length``; ``truncation`` cuts to
        ``max_length`` from the left. ``return_tensors="np"`` gives int32 arrays.
        """
        if return_tensors not in (None, "np"):
            raise BadInput(f"the character tokenizer returns lists or numpy arrays; got return_tensors={return_tensors!r}, use 'np'")
        single = isinstance(text, str)
        texts = [text] if single else list(text)
        seqs = [self.encode(t, add_special_tokens=add_special_tokens) for t in texts]
        if truncation and max_length is not None:
            seqs = [s[len(s) - max_length :] if len(s) > max_length else s for s in seqs]
        if padding in (True, "longest", "max_length"):
            width = max_length if padding == "max_length" and max_length is not None else max(map(len, seqs), default=0)
            width = max(width, max(map(len, seqs), default=0))
            masks = [[0] * (width - len(s)) + [1] * len(s) for s in seqs]
            seqs = [[self.pad_id] * (width - len(s)) + s for s in seqs]
        else:
            masks = [[1] * len(s) for s in seqs]
        if return_tensors == "np":
            if len({len(s) for s in seqs}) > 1:
                raise BadInput("sequences of different lengths cannot form an array; pass padding=True")
            # [B, T] even for one string, as transformers does.
            seqs, masks = np.asarray(seqs, np.int32), np.asarray(masks, np.int32)
        elif single:
            seqs, masks = seqs[0], masks[0]
        return {"input_ids": seqs, "attention_mask": masks}

    def apply_chat_template(self, *args, **kwargs):
        raise BadInput(
            "the character tokenizer has no chat template; set data.use_chat_template=false "
            "and give prompts as strings"
        )
