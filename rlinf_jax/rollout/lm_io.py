"""Text in and out of the language-model sampler: prompts to left-padded ids, SFT targets to
right-padded ids, sampled tokens back to text, and the sampler's construction and weight sync.

Sequences are laid out as ``[prompt | response]``: the prompt left-padded to a sampler
bucket width, the response right-padded to ``rollout.max_new_tokens`` with a mask
(`rlinf_jax.policies.lm.logprobs` scores them in that layout).
"""

from __future__ import annotations

import re

import numpy as np
from flax import nnx

from rlinf_jax.agents.syntax import ERROR_CLOSE, ERROR_OPEN, RESULT_CLOSE, RESULT_OPEN

from rlinf_jax.data import DataConfig, PromptTemplate
from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm import CausalLM
from rlinf_jax.rollout.sampler import Sampler, bucket_length
from rlinf_jax.runtime.distributed import is_multiprocess
from rlinf_jax.sharding import param_shardings, put


def stop_tokens(tokenizer) -> tuple[int, ...]:
    eos = tokenizer.eos_token_id
    if eos is None:
        raise BadInput("the tokenizer has no end-of-sequence token; generation would never stop")
    return (int(eos),)


def pad_id(tokenizer) -> int:
    pid = tokenizer.pad_token_id
    return int(tokenizer.eos_token_id if pid is None else pid)


class PromptEncoder:
    """Prompts -> left-padded ids of a sampler bucket width (``[B, P]``, mask)."""

    def __init__(self, data: DataConfig, tokenizer):
        self.tokenizer = tokenizer
        self.template = PromptTemplate(data.template, data.use_chat_template, data.system_prompt, tokenizer)
        self.max_len = data.max_prompt_length
        self.pad_id = pad_id(tokenizer)

    def encode(self, prompts, ids=None) -> list[list[int]]:
        out = []
        for i, prompt in enumerate(prompts):
            chat = self.template.use_chat_template or not isinstance(prompt, str)
            text = self.template.render(prompt)
            # A chat-rendered text already holds the model's start and turn tokens.
            toks = list(self.tokenizer.encode(text, add_special_tokens=not chat))
            if len(toks) > self.max_len:
                name = f" {ids[i]!r}" if ids is not None else ""
                raise BadInput(
                    f"prompt{name} has {len(toks)} tokens, more than data.max_prompt_length={self.max_len}; "
                    "raise data.max_prompt_length or shorten the prompt"
                )
            out.append(toks)
        return out

    def check_lengths(self, dataset, label: str) -> None:
        """Every prompt of ``dataset`` fits ``data.max_prompt_length``, checked once before
        training (a long prompt would otherwise stop the run when its batch comes up)."""
        for i in range(len(dataset)):
            rec = dataset[i]
            try:
                self.encode([rec["prompt"]], [rec.get("id", str(i))])
            except BadInput as e:
                raise BadInput(f"{label} data: {e}") from None

    def pad(self, seqs: list[list[int]], width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        width = bucket_length(max(map(len, seqs)), 8) if width is None else width
        ids = np.full((len(seqs), width), self.pad_id, np.int32)
        mask = np.zeros((len(seqs), width), np.int32)
        for r, s in enumerate(seqs):
            ids[r, width - len(s) :] = s
            mask[r, width - len(s) :] = 1
        return ids, mask

    def __call__(self, prompts, ids=None, width: int | None = None):
        return self.pad(self.encode(prompts, ids), width)


def encode_targets(tokenizer, targets, width: int) -> tuple[np.ndarray, np.ndarray]:
    """SFT targets + end token, right-padded to ``width`` (``[B, N]`` ids, mask); a target
    longer than ``width`` is an error, not a silently truncated answer."""
    eos, pad = stop_tokens(tokenizer)[0], pad_id(tokenizer)
    ids = np.full((len(targets), width), pad, np.int32)
    mask = np.zeros((len(targets), width), np.int32)
    for r, t in enumerate(targets):
        toks = [*tokenizer.encode(t, add_special_tokens=False), eos]
        if len(toks) > width:
            raise BadInput(
                f"the SFT target {t!r} takes {len(toks)} tokens with its end token, more than "
                f"rollout.max_new_tokens={width}; raise rollout.max_new_tokens"
            )
        ids[r, : len(toks)] = toks
        mask[r, : len(toks)] = 1
    return ids, mask


_OBSERVATION = re.compile(
    f"({re.escape(RESULT_OPEN)}.*?{re.escape(RESULT_CLOSE)}|{re.escape(ERROR_OPEN)}.*?{re.escape(ERROR_CLOSE)})", re.S
)


def encode_transcripts(tokenizer, targets, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tool-use transcripts (model text with ``<result>...</result>`` / ``<error>...</error>``
    observations inside) + end token, right-padded to ``width``: ``(ids, loss mask, valid)``.

    Each model part and each observation is tokenised on its own, as the multi-turn rollout
    does; the loss mask is 0 on observations (the environment writes them, the model only
    reads them), as in the RL loss.
    """
    eos, pad = stop_tokens(tokenizer)[0], pad_id(tokenizer)
    ids = np.full((len(targets), width), pad, np.int32)
    loss = np.zeros((len(targets), width), np.int32)
    valid = np.zeros((len(targets), width), np.int32)
    for r, t in enumerate(targets):
        toks, mask = [], []
        for k, part in enumerate(_OBSERVATION.split(t)):
            piece = list(tokenizer.encode(part, add_special_tokens=False)) if part else []
            toks += piece
            mask += [k % 2 == 0] * len(piece)  # split() alternates text, observation, text, ...
        toks.append(eos)
        mask.append(True)
        if len(toks) > width:
            raise BadInput(
                f"the SFT transcript {t[:60]!r}... takes {len(toks)} tokens with its end token, more than "
                f"rollout.max_new_tokens={width}; raise rollout.max_new_tokens"
            )
        ids[r, : len(toks)] = toks
        loss[r, : len(toks)] = mask
        valid[r, : len(toks)] = 1
    return ids, loss, valid


def decode_responses(tokenizer, tokens, mask) -> list[str]:
    """Response texts (special tokens dropped) of ``tokens [B, N]`` under ``mask``."""
    tokens, mask = np.asarray(tokens), np.asarray(mask).astype(bool)
    return [tokenizer.decode(row[m].tolist(), skip_special_tokens=True) for row, m in zip(tokens, mask)]


def make_sampler(model: CausalLM, pad: int, mesh, rules) -> Sampler:
    """The run's `Sampler` on ``mesh``, its weights laid out from the host.

    In a multi-host job the model's arrays are this process's own copies; placed through
    `put`, each process fills its shards, where the sampler's own placement would first
    compare every weight across all processes.
    """
    if is_multiprocess():
        graphdef, params = nnx.split(model)
        model = nnx.merge(graphdef, put(params, param_shardings(params, mesh, rules)))
    return Sampler(model, pad_id=pad, mesh=mesh, rules=rules)


def sync_sampler(sampler: Sampler, weights) -> None:
    """Weight sync: ``weights`` (the actor's) onto the sampler's layout, also across hosts
    (`Sampler.set_params` reshards, and `reshard` goes through `put` there)."""
    sampler.set_params(weights)
