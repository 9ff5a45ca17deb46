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


def policy_logprobs(model: CausalLM, batch: dict, temperature: float = 1.0, group: int = 1, logits_chunk: int = 0):
    """``(logp, entropy)`` ``[B, N]`` of the batch's response tokens under ``model``
    (``group``: see `response_hidden`).

    ``logits_chunk > 0`` (``actor.model.logits_chunk``) on the ``xla`` backend: the output
    head runs that many vocabulary columns at a time (`chunked_token_logprobs`), so the
    ``[B, N, vocab]`` logits are never held whole; the ``mkl`` backend keeps its own kernel.
    """
    h = response_hidden(model, batch["prompt_ids"], batch["prompt_mask"], batch["tokens"], attended(batch), group)
    if logits_chunk > 0 and model.matmul == "xla":
        weights, vocab_axis = output_head(model)
        return chunked_token_logprobs(h, weights, vocab_axis, batch["tokens"], temperature, logits_chunk, model.dtype)
    return token_logprobs(model.logits(h), batch["tokens"], temperature, model.matmul)


def output_head(model: CausalLM) -> tuple[jax.Array, int]:
    """The output head's weights and their vocabulary axis: the tied embedding table
    ``[vocab, embed]`` (axis 0) or the ``lm_head`` kernel ``[embed, vocab]`` (axis 1)."""
    if model.embed is None:
        raise ValueError("this model was built with token_embeddings=False: it has no output head")
    if model.lm_head is None:
        return model.embed.embedding[...], 0
    return model.lm_head.kernel[...], 1


def chunked_token_logprobs(hidden, weights, vocab_axis: int, tokens, temperature: float = 1.0, chunk: int = 8192,
                           dtype=jnp.float32):
    """`token_logprobs` of the logits ``hidden [B, N, embed]`` x the head ``weights``, computed
    ``chunk`` vocabulary columns at a time; the ``[B, N, vocab]`` logits never exist whole.

    An online softmax (as in flash attention) runs over the chunks with, per row, the running
    maximum ``m`` of the scaled logits ``z``, ``s = sum exp(z - m)``, ``u = sum exp(z - m) (z - m)``
    and the chosen token's ``z``; when ``m`` grows to ``m'`` the sums are rescaled by
    ``exp(m - m')`` (``u`` also shifted by ``(m - m') s``). At the end ``log Z = m + log s``,
    ``log pi(token) = z_token - log Z`` and the entropy ``log Z - E_p[z] = log s - u / s``. The
    maximum carries no gradient (the results do not depend on it), as in `token_logprobs`.

    Each chunk's step is rematerialised (``jax.checkpoint``): the backward pass recomputes the
    chunk's logits from ``hidden`` and the head instead of keeping them, so memory holds one
    chunk's ``[B * N, chunk]`` at a time. The last chunk is the remainder when ``chunk`` does
    not divide the vocabulary. The products run in ``dtype`` accumulated in float32, as the
    model's own head does (`CausalLM.logits`).
    """
    lead = hidden.shape[:-1]
    h = hidden.reshape(-1, hidden.shape[-1]).astype(dtype)
    ids = tokens.reshape(-1)
    vocab = weights.shape[vocab_axis]
    chunk = min(int(chunk), vocab)
    scaled = temperature not in (0.0, 1.0)

    def step(carry, start, size):
        m, s, u, chosen = carry
        w = jax.lax.dynamic_slice_in_dim(weights, start, size, axis=vocab_axis).astype(dtype)
        contract = ((1,), (1 - vocab_axis,))
        z = jax.lax.dot_general(h, w, (contract, ((), ())), preferred_element_type=jnp.float32)
        if scaled:
            z = z / temperature
        new_m = jnp.maximum(m, jax.lax.stop_gradient(jnp.max(z, axis=-1)))
        shifted = z - new_m[:, None]
        e = jnp.exp(shifted)
        decay = jnp.exp(m - new_m)
        u = decay * (u + (m - new_m) * s) + jnp.sum(e * shifted, axis=-1)
        s = decay * s + jnp.sum(e, axis=-1)
        hit = (start + jnp.arange(size)) == ids[:, None]
        chosen = chosen + jnp.sum(jnp.where(hit, z, 0.0), axis=-1)
        return new_m, s, u, chosen

    rows = h.shape[0]
    # The lowest finite float as the first maximum: exp(m - m') is then exactly 0, where
    # -inf would give inf - inf on the first rescale.
    zeros = jnp.zeros((rows,), jnp.float32)
    carry = (jnp.full((rows,), jnp.finfo(jnp.float32).min, jnp.float32), zeros, zeros, zeros)
    full, rest = divmod(vocab, chunk)
    # No common subexpression spans two steps of a scan: the checkpoint's guard against XLA
    # merging the recomputation with the forward pass is not needed there.
    body = jax.checkpoint(lambda c, i: (step(c, i * chunk, chunk), None), prevent_cse=False)
    carry, _ = jax.lax.scan(body, carry, jnp.arange(full))
    if rest:
        carry = jax.checkpoint(lambda c: step(c, full * chunk, rest))(carry)
    m, s, u, chosen = carry
    log_s = jnp.log(s)
    logp = chosen - m - log_s
    entropy = log_s - u / s
    return logp.reshape(lead), entropy.reshape(lead)


def values_of(value_model: ValueModel, batch: dict):
    """V before each response token, ``[B, N]`` (float32)."""
    h = response_hidden(
        value_model.trunk, batch["prompt_ids"], batch["prompt_mask"], batch["tokens"], attended(batch)
    )
    return value_model.head(h)


def chunked(fn, batch: dict, chunk: int, layout=None):
    """``fn(batch)`` evaluated ``chunk`` rows at a time (``lax.map``), to bound activation
    memory of a forward pass over a whole rollout batch; outputs concatenated.

    ``layout`` (a sharding of the ``[chunks, chunk, ...]`` parts, e.g. ``P(None, batch
    axes)``) spreads each chunk's rows over the devices. Without it a batch split by rows
    over N devices is cut into chunks that each live on one device, and every step of the
    map gathers its chunk whole onto every device: on 16 TPU chips that was 8 GiB of a 7B
    update's temporaries."""
    B = next(iter(batch.values())).shape[0]
    if chunk >= B or B % chunk:
        return fn(batch)
    parts = jax.tree.map(lambda x: x.reshape(B // chunk, chunk, *x.shape[1:]), batch)
    if layout is not None:
        parts = jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, layout), parts)
    out = jax.lax.map(fn, parts)
    return jax.tree.map(lambda x: x.reshape(B, *x.shape[2:]), out)
