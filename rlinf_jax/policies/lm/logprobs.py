"""Token log-probabilities of responses under a causal LM, and the value model's values.

Sequences are laid out as ``[prompt | response]``: the prompt left-padded to a width ``P``
(a sampler bucket), the response right-padded to ``N`` tokens with a mask. Response token
``j`` sits at column ``P + j`` and is predicted by the hidden state at ``P + j - 1``, so the
logits (and the value head) only ever run on the ``N`` columns ``P - 1 .. P + N - 2``: for a
150k vocabulary the output projection of the prompt would be most of the work.

A GRPO batch samples each prompt ``group`` times, in consecutive rows. With ``group > 1`` the
prompt columns run through the model once per prompt rather than once per row: their keys
and values are computed for the distinct prompts and shared by the rows of the group (the
decode path's KV cache, written by a prefill), and only the response columns run per row.
The same numbers up to float rounding; the prompt's share of the work drops by ``group``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlinf_jax.kernels import mkl
from rlinf_jax.policies.lm.model import CausalLM
from rlinf_jax.policies.lm.value import ValueModel


def response_hidden(model: CausalLM, prompt_ids, prompt_mask, tokens, response_mask, group: int = 1):
    """Final hidden states ``[B, N, embed]`` at the columns that predict each response token.

    Column ``P - 1 + t`` predicts response token ``t``. The last response token predicts
    nothing scored and, by causality, no scored column sees it, so it is left out of the
    input; the model's last layer runs only on the ``N`` scored columns (``output_cols``).

    ``group > 1``: rows ``g * group .. (g + 1) * group - 1`` share one prompt (the caller
    guarantees it), which then runs once per group (see the module's docstring).
    """
    P, N = prompt_ids.shape[1], tokens.shape[1]
    mask = jnp.concatenate([prompt_mask, response_mask[:, :-1]], axis=1).astype(jnp.int32)
    if group > 1 and N > 1:
        return _shared_prompt_hidden(model, prompt_ids, mask, tokens, group)
    ids = jnp.concatenate([prompt_ids, tokens[:, :-1]], axis=1)
    return model.hidden_states(ids, mask, output_cols=(P - 1, N))


def _shared_prompt_hidden(model: CausalLM, prompt_ids, mask, tokens, group: int):
    """`response_hidden` with the prompt run once per group of rows: a prefill of the
    distinct prompts into a KV cache, the cache repeated to every row of its group, then
    the response columns on top of it. ``mask [B, P + N - 1]`` covers both parts.

    Positions and visibility are the ones of the single pass: the cache path counts real
    tokens over the same mask, and its slots past a query are masked as future. Gradients
    reach the shared prompt columns summed over the group, through the repeat.
    """
    B, P = prompt_ids.shape
    if B % group:
        raise ValueError(f"{B} rows do not split into groups of {group}")
    cache = model.init_cache(B // group, mask.shape[1])
    # The prompt's queries see only earlier slots, so the first row's response mask, which
    # the group's prefill carries along, never reaches them.
    # Only the prompt's last column is scored: the last layer's queries and MLP run there alone.
    prompt_h, cache = model.hidden_states(
        prompt_ids[::group], mask[::group], cache=cache, cache_index=0, output_cols=(P - 1, 1)
    )
    shared = lambda x: jnp.repeat(x, group, axis=0)  # noqa: E731
    cache = cache.map_rows(shared)
    response_h, _ = model.hidden_states(tokens[:, :-1], mask, cache=cache, cache_index=P)
    return jnp.concatenate([shared(prompt_h), response_h], axis=1)


def token_logprobs(logits, tokens, temperature: float = 1.0, backend: str = "xla"):
    """``(log pi(token), entropy)`` per position, ``[B, N]`` each, of ``softmax(logits / T)``.

    The temperature is the sampler's: its log-probs are those of the scaled distribution.
    ``backend="mkl"`` (a model built with ``matmul="mkl"``) computes float32 logits' rows in
    the kernel library (`rlinf_jax.kernels.mkl.token_logprobs`): one pass per row in cache
    where XLA's CPU code makes several over the whole ``[B, N, vocab]`` array.
    """
    if backend == "mkl" and logits.dtype == jnp.float32:
        return mkl.token_logprobs(logits, tokens, temperature if temperature not in (0.0, 1.0) else 1.0)
    scaled = logits / temperature if temperature not in (0.0, 1.0) else logits
    # Written so that every pass over the [B, N, vocab] logits, forward and backward, is an
    # elementwise map or a reduction that XLA fuses: the chosen logit is picked with a
    # comparison against the vocabulary index rather than a gather, whose gradient would be
    # a scatter into a zeroed [B, N, vocab] array, and the log-softmax is never written out.
    shifted = scaled - jax.lax.stop_gradient(jnp.max(scaled, axis=-1, keepdims=True))
    log_z = jnp.log(jnp.sum(jnp.exp(shifted), axis=-1))
    chosen = jnp.arange(scaled.shape[-1]) == tokens[..., None]
    logp = jnp.sum(jnp.where(chosen, shifted, 0.0), axis=-1) - log_z
    # H = log Z - E_p[shifted]; p is exact where it underflows to 0 (p * shifted is then 0).
    p = jnp.exp(shifted - log_z[..., None])
    entropy = log_z - jnp.sum(p * shifted, axis=-1)
    return logp, entropy


def attended(batch: dict):
    """The response tokens the model reads: ``response_valid`` when the batch has it (a
    multi-turn episode, whose observations are read but not scored: ``response_mask`` is
    then the loss mask), else ``response_mask``."""
    return batch.get("response_valid", batch["response_mask"])


def policy_logprobs(model: CausalLM, batch: dict, temperature: float = 1.0, group: int = 1):
    """``(logp, entropy)`` ``[B, N]`` of the batch's response tokens under ``model``
    (``group``: see `response_hidden`)."""
    h = response_hidden(model, batch["prompt_ids"], batch["prompt_mask"], batch["tokens"], attended(batch), group)
    return token_logprobs(model.logits(h), batch["tokens"], temperature, model.matmul)


def values_of(value_model: ValueModel, batch: dict):
    """V before each response token, ``[B, N]`` (float32)."""
    h = response_hidden(
        value_model.trunk, batch["prompt_ids"], batch["prompt_mask"], batch["tokens"], attended(batch)
    )
    return value_model.head(h)


def chunked(fn, batch: dict, chunk: int):
    """``fn(batch)`` evaluated ``chunk`` rows at a time (``lax.map``), to bound activation
    memory of a forward pass over a whole rollout batch; outputs concatenated."""
    B = next(iter(batch.values())).shape[0]
    if chunk >= B or B % chunk:
        return fn(batch)
    parts = jax.tree.map(lambda x: x.reshape(B // chunk, chunk, *x.shape[1:]), batch)
    out = jax.lax.map(fn, parts)
    return jax.tree.map(lambda x: x.reshape(B, *x.shape[2:]), out)
