"""Batched LM sampling on a static KV cache: one jitted prefill, one jitted decode loop.

- The cache (`KVCache`) has ``S = prompt bucket + generation bucket`` slots per row.
  Prefill writes the prompt into it; the decode loop is a ``lax.while_loop`` that writes
  one token per step in place (the cache is donated to the decode call) and stops
  early once every row has emitted a stop token.
- Shapes are bucketed (``bucket_length``): prompts are left-padded to their bucket, the
  generation length is rounded up, and ``max_new_tokens``, temperature and top-p are traced
  values, so a run compiles once per (batch, prompt bucket, generation bucket, top-k,
  top-p on/off, greedy) and not per request.
- Randomness is per sample: row ``i`` draws from ``fold_in(fold_in(key, sample_ids[i]), step)``.
  The same sample id gets the same draws whatever batch it is cut into.
- ``generate(..., group=G)``: rows come in runs of ``G`` consecutive copies of one prompt
  (a GRPO group). Each distinct prompt is prefilled once and the filled cache repeated to
  the rows of its run: same numbers, the prefill's work divided by ``G``. The caller names
  ``G`` (it is static: guessing it from the rows would recompile whenever two neighbouring
  groups happened to hold the same prompt).
- Sampling uses one uniform per row and step and inverts the CDF of the (filtered)
  distribution; exact like the Gumbel trick, but with ``B`` random numbers a step instead
  of ``B * vocab``, which matters on CPU.
- On a mesh (``Sampler(model, mesh=...)``, e.g. the rollout's component mesh) parameters are
  laid out by the partition rules (heads, MLP and vocabulary over ``tensor``, ...), and the
  batch rows (prompts, cache, outputs) are split over ``data`` and ``fsdp`` and the cache's KV
  heads over ``tensor``, each only where the axis divides the size (else that dimension
  stays whole). The layout is pinned inside the jitted prefill and decode, so the cache the
  decode loop carries and donates never changes layout. Since each row's randomness is
  its own, a sharded run samples what a single-device run samples.

Log-probs: ``logprobs[b, t]`` is ``log_softmax(logits / temperature)`` at the chosen token:
the temperature-scaled distribution *before* top-k / top-p truncation, which is what a
trainer recomputes from the same logits (``temperature=1`` for greedy rows). Outputs past a
row's stop token are ``pad_id`` with ``mask == 0``; the stop token itself is kept with
``mask == 1`` (it is part of the response the policy chose).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm.model import without_remat
from rlinf_jax.sharding.partition import DEFAULT_RULES, logical_to_spec, param_shardings
from rlinf_jax.sharding.reshard import reshard


def bucket_length(n: int, minimum: int = 8) -> int:
    """Round a length up to its bucket: a multiple of a quarter of the power of two below it
    (and of ``minimum``). Padding stays under 25% (prefill cost grows with it) while the
    number of buckets, hence compilations, grows only logarithmically:
    8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, ...
    """
    n = max(int(n), 1)
    if n <= minimum:
        return minimum
    below = 1 << ((n - 1).bit_length() - 1)  # largest power of two < n
    step = max(minimum, below // 4)
    return -(-n // step) * step


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # 1 = off
    top_k: int = 0  # 0 = off
    stop_tokens: tuple[int, ...] = ()

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise BadInput(f"max_new_tokens={self.max_new_tokens} must be >= 1")
        if self.temperature < 0:
            raise BadInput(f"temperature={self.temperature} must be >= 0 (0 means greedy)")
        if not 0 < self.top_p <= 1:
            raise BadInput(f"top_p={self.top_p} must be in (0, 1]")
        if self.top_k < 0:
            raise BadInput(f"top_k={self.top_k} must be >= 0 (0 means off)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class SampleOutput(NamedTuple):
    tokens: jax.Array  # [B, max_new_tokens] int32, pad_id after a stop token
    logprobs: jax.Array  # [B, max_new_tokens] float32, 0 where mask is 0
    mask: jax.Array  # [B, max_new_tokens] bool: token belongs to the response
    lengths: jax.Array  # [B] int32: number of response tokens (stop token included)


class DecodeState(NamedTuple):
    """What the decode loop carries; the prefill returns it with step 1 done."""

    cache: object  # KVCache
    key_mask: jax.Array  # [B, S] valid cache slots (prompt mask + generation slots)
    prompt_lengths: jax.Array  # [B] real prompt tokens: the position of the first new token
    uniforms: jax.Array  # [B, N] the uniform each row draws its token with at each step
    tokens: jax.Array  # [B, N]
    logprobs: jax.Array  # [B, N]
    done: jax.Array  # [B]
    step: jax.Array  # scalar int32: tokens generated so far


class Layout(NamedTuple):
    """Where the sampler's arrays live on a mesh (hashable: a static argument of the jits).

    ``rows`` splits the leading (batch) axis of every per-row array; ``cache`` is for the
    KV arrays (``[B, kv_heads, ...]``); ``replicated`` for scalars and the key.
    """

    rows: jax.sharding.NamedSharding
    cache: jax.sharding.NamedSharding
    replicated: jax.sharding.NamedSharding

    @classmethod
    def for_batch(cls, mesh, batch: int, kv_heads: int, rules=None) -> Layout:
        rows = logical_to_spec(("batch",), mesh, rules, shape=(batch,))
        cache = logical_to_spec(("batch", "kv_heads"), mesh, rules, shape=(batch, kv_heads))
        return cls(NamedSharding(mesh, rows), NamedSharding(mesh, cache), NamedSharding(mesh, PartitionSpec()))

    def pin_cache(self, cache):
        """``cache`` (a `KVCache`) constrained to this layout (inside a jit)."""
        pin = functools.partial(jax.lax.with_sharding_constraint, shardings=self.cache)
        return cache.map_rows(pin)

    def pin_state(self, state: DecodeState) -> DecodeState:
        """``state`` constrained to this layout (inside a jit)."""
        pin = jax.lax.with_sharding_constraint
        rows = {f: pin(getattr(state, f), self.rows) for f in _ROW_FIELDS}
        return state._replace(cache=self.pin_cache(state.cache), step=pin(state.step, self.replicated), **rows)


_ROW_FIELDS = ("key_mask", "prompt_lengths", "uniforms", "tokens", "logprobs", "done")


def _filter_logits(logits, top_k: int, use_top_p: bool, top_p):
    """Mask logits outside the top-k and the top-p nucleus with -inf (float32 ``[B, V]``)."""
    if top_k:
        kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if use_top_p:
        sorted_desc = -jnp.sort(-logits, axis=-1)
        probs = jax.nn.softmax(sorted_desc, axis=-1)
        # Keep the smallest prefix whose mass reaches top_p: a token stays if the mass
        # strictly before it is < top_p. Ties at the threshold logit are all kept.
        before = jnp.cumsum(probs, axis=-1) - probs
        keep = before < top_p
        threshold = jnp.min(jnp.where(keep, sorted_desc, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < threshold, -jnp.inf, logits)
    return logits


def _inverse_cdf(weights, u):
    """Index ``i`` with probability ``weights[b, i] / sum(weights[b])`` for each row, given
    one uniform ``u[b]`` in [0, 1).

    Two levels: find the block of ``C`` entries holding the target mass from the block sums,
    then the entry inside that block. Cumulative sums run over ``V / C + C`` numbers instead
    of ``V``; a full-vocabulary cumsum was the single most expensive op of a CPU decode step.
    Rounding can never pick an entry of zero weight: both levels clamp into the support.
    """
    B, V = weights.shape
    C = max(64, 1 << (int(np.sqrt(V)) - 1).bit_length())
    n_blocks = -(-V // C)
    blocks = jnp.pad(weights, ((0, 0), (0, n_blocks * C - V))).reshape(B, n_blocks, C)
    block_mass = blocks.sum(axis=-1)
    block_cdf = jnp.cumsum(block_mass, axis=-1)
    target = u * block_cdf[:, -1]
    block = jnp.sum(block_cdf <= target[:, None], axis=-1)
    block = jnp.minimum(block, n_blocks - 1 - jnp.argmax(block_mass[:, ::-1] > 0, axis=-1))
    mass_before = jnp.take_along_axis(block_cdf - block_mass, block[:, None], axis=-1)[:, 0]
    inner = jnp.take_along_axis(blocks, block[:, None, None], axis=1)[:, 0]
    inner_cdf = jnp.cumsum(inner, axis=-1)
    index = jnp.sum(inner_cdf <= (target - mass_before)[:, None], axis=-1)
    first = jnp.argmax(inner > 0, axis=-1)
    last = C - 1 - jnp.argmax(inner[:, ::-1] > 0, axis=-1)
    return block * C + jnp.clip(index, first, last)


def choose_token(logits, u, temperature, top_p, *, greedy, top_k, use_top_p):
    """Next token and its log-prob for each row (``logits`` float32 ``[B, V]``, ``u [B]`` the
    rows' uniforms for this step)."""
    if greedy:
        token = jnp.argmax(logits, axis=-1)
        logp = jax.nn.log_softmax(logits, axis=-1)
    else:
        scaled = logits / temperature
        # One exp pass serves both the log-probs and the (unnormalised) sampling weights.
        shifted = scaled - jnp.max(scaled, axis=-1, keepdims=True)
        weights = jnp.exp(shifted)
        logp = shifted - jnp.log(jnp.sum(weights, axis=-1, keepdims=True))
        if top_k or use_top_p:
            keep = _filter_logits(scaled, top_k, use_top_p, top_p) > -jnp.inf
            weights = jnp.where(keep, weights, 0.0)
        token = _inverse_cdf(weights, u)
    chosen = jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0]
    return token.astype(jnp.int32), chosen


def _record(state: DecodeState, token, logp, stop_tokens, pad_id) -> DecodeState:
    live = ~state.done
    token = jnp.where(live, token, pad_id)
    logp = jnp.where(live, logp, 0.0)
    col = (0, state.step)
    return state._replace(
        tokens=jax.lax.dynamic_update_slice(state.tokens, token[:, None], col),
        logprobs=jax.lax.dynamic_update_slice(state.logprobs, logp[:, None], col),
        done=state.done | (live & jnp.isin(token, stop_tokens)),
        step=state.step + 1,
    )


def token_uniforms(key, sample_ids, steps: int) -> jax.Array:
    """``[B, steps]``: row b, step t draws ``uniform(fold_in(fold_in(key, sample_ids[b]), t))``.

    Drawn up front in one batched call rather than inside the decode loop.
    """

    def row(sample_id):
        row_key = jax.random.fold_in(key, sample_id)
        return jax.vmap(lambda t: jax.random.uniform(jax.random.fold_in(row_key, t)))(jnp.arange(steps))

    return jax.vmap(row)(sample_ids)


@functools.partial(
    jax.jit,
    static_argnames=("graphdef", "gen_len", "greedy", "top_k", "use_top_p", "pad_id", "layout", "group",
                     "prompt_layout"),
)
def prefill_prompts(
    graphdef, params, prompt, prompt_mask, key, sample_ids, temperature, top_p, stop_tokens,
    *, gen_len, greedy, top_k, use_top_p, pad_id, layout=None, group=1, prompt_layout=None,
):
    """``prompt`` holds each distinct prompt once: row ``i`` of it is sampled by rows
    ``i * group .. (i + 1) * group - 1`` (``prompt_layout``: where those rows live)."""
    model = nnx.merge(graphdef, params)
    U, P = prompt.shape
    key_mask = jnp.concatenate([prompt_mask.astype(bool), jnp.ones((U, gen_len), bool)], axis=1)
    cache = model.init_cache(U, P + gen_len)
    if layout is not None:
        # Created inside the jit, the cache has no layout of its own: give it the state's
        # before the prompt is written into it.
        cache = (prompt_layout or layout).pin_cache(cache)
    # Left-padded: the last column is every row's last token, the only one whose logits are read.
    hidden, cache = model.hidden_states(prompt, key_mask, cache=cache, cache_index=0, output_cols=(P - 1, 1))
    logits = model.logits(hidden[:, 0])
    if group > 1:
        rows = functools.partial(jnp.repeat, repeats=group, axis=0)
        cache = cache.map_rows(rows)
        logits, key_mask, prompt_mask = rows(logits), rows(key_mask), rows(prompt_mask)
    B = U * group
    uniforms = token_uniforms(key, sample_ids, gen_len)
    state = DecodeState(
        cache=cache,
        key_mask=key_mask,
        prompt_lengths=prompt_mask.sum(axis=1, dtype=jnp.int32),
        uniforms=uniforms,
        tokens=jnp.full((B, gen_len), pad_id, jnp.int32),
        logprobs=jnp.zeros((B, gen_len), jnp.float32),
        done=jnp.zeros((B,), bool),
        step=jnp.zeros((), jnp.int32),
    )
    token, logp = choose_token(logits, uniforms[:, 0], temperature, top_p, greedy=greedy, top_k=top_k,
                               use_top_p=use_top_p)
    state = _record(state, token, logp, stop_tokens, pad_id)
    return state if layout is None else layout.pin_state(state)


@functools.partial(
    jax.jit,
    static_argnames=("graphdef", "prompt_len", "greedy", "top_k", "use_top_p", "pad_id", "layout"),
    donate_argnames=("state",),
)
def decode_tokens(
    graphdef, params, state: DecodeState, max_new_tokens, temperature, top_p, stop_tokens,
    *, prompt_len, greedy, top_k, use_top_p, pad_id, layout=None,
):
    model = nnx.merge(graphdef, params)

    def cond(s: DecodeState):
        return (s.step < max_new_tokens) & ~jnp.all(s.done)

    def body(s: DecodeState):
        # The last sampled token goes into slot prompt_len + step - 1 and predicts the next.
        last = jax.lax.dynamic_slice_in_dim(s.tokens, s.step - 1, 1, axis=1)
        positions = (s.prompt_lengths + s.step - 1)[:, None]
        logits, cache = model(last, s.key_mask, positions, cache=s.cache, cache_index=prompt_len + s.step - 1)
        u = jax.lax.dynamic_index_in_dim(s.uniforms, s.step, axis=1, keepdims=False)
        token, logp = choose_token(logits[:, 0], u, temperature, top_p, greedy=greedy, top_k=top_k,
                                   use_top_p=use_top_p)
        s = _record(s._replace(cache=cache), token, logp, stop_tokens, pad_id)
        # The loop carry keeps the layout it came in with (the donated buffers are reused).
        return s if layout is None else layout.pin_state(s)

    return jax.lax.while_loop(cond, body, state)


class Sampler:
    """Generates continuations of left-padded prompts with a causal LM.

    ``Sampler(model)`` splits the model once; ``set_params`` swaps in new weights (same
    structure, e.g. after a training step) without recompiling.

    With ``mesh`` (a `jax.sharding.Mesh` with some of the axes ``data``, ``fsdp``,
    ``tensor``), parameters are placed by `param_shardings` under ``rules`` (default
    `DEFAULT_RULES`) and each batch is split as `Layout.for_batch` says; ``set_params``
    moves new weights onto the same layout (no copy for leaves already there).
    """

    def __init__(self, model, *, pad_id: int = 0, min_bucket: int = 8, mesh=None, rules=None):
        self.graphdef, params = nnx.split(without_remat(model))  # sampling is never differentiated
        self.vocab_size = model.config.vocab_size
        self.num_kv_heads = model.config.num_kv_heads
        self.pad_id = int(pad_id)
        self.min_bucket = min_bucket
        self.mesh = mesh
        self.rules = DEFAULT_RULES if rules is None else rules
        self.param_shardings = None if mesh is None else param_shardings(params, mesh, self.rules)
        self.set_params(params)

    def set_params(self, params) -> None:
        self.params = params if self.param_shardings is None else reshard(params, self.param_shardings)

    def release_params(self) -> None:
        """Lets go of the weights until the next `set_params`: a trainer whose rollout shares
        chips with its actor frees the rollout's copy while the actor updates (the copy is
        stale then, and rebuilt from the new weights right after)."""
        self.params = None

    def layout(self, batch: int) -> Layout | None:
        """Where a batch of ``batch`` rows lives (None without a mesh)."""
        if self.mesh is None:
            return None
        return Layout.for_batch(self.mesh, batch, self.num_kv_heads, self.rules)

    def generate(
        self, prompt_ids, prompt_mask, key, sampling: SamplingParams, sample_ids=None, group: int = 1
    ) -> SampleOutput:
        """Sample ``sampling.max_new_tokens`` tokens after each prompt.

        ``prompt_ids`` / ``prompt_mask`` are ``[B, P]`` and left-padded (every row's last
        column is a real token). ``sample_ids [B]`` name each row's random stream (default
        ``0..B-1``); ``key`` is the run's key. ``group``: rows ``i * group .. (i + 1) * group - 1``
        hold one prompt, prefilled once for them all.
        """
        prompt_ids = np.asarray(prompt_ids)
        prompt_mask = np.asarray(prompt_mask).astype(bool)
        if prompt_ids.ndim != 2 or prompt_ids.shape != prompt_mask.shape:
            raise BadInput(
                f"prompt_ids {prompt_ids.shape} and prompt_mask {prompt_mask.shape} must both be [batch, length]"
            )
        if not prompt_mask[:, -1].all():
            raise BadInput("prompts must be left-padded: every row's last column must be a real token")
        B, P = prompt_ids.shape
        sample_ids = np.arange(B) if sample_ids is None else np.asarray(sample_ids)
        if sample_ids.shape != (B,):
            raise BadInput(f"sample_ids has shape {sample_ids.shape}; it needs one id per prompt, ({B},)")
        if sampling.top_k > self.vocab_size:
            raise BadInput(f"top_k={sampling.top_k} exceeds the vocabulary ({self.vocab_size}); use 0 for no top-k")
        P_b = bucket_length(P, self.min_bucket)
        N_b = bucket_length(sampling.max_new_tokens, self.min_bucket)
        ids = np.full((B, P_b), self.pad_id, np.int32)
        ids[:, P_b - P :] = prompt_ids
        mask = np.zeros((B, P_b), bool)
        mask[:, P_b - P :] = prompt_mask
        static = {
            "greedy": sampling.greedy,
            "top_k": int(sampling.top_k),
            "use_top_p": sampling.top_p < 1.0,
            "pad_id": self.pad_id,
        }
        layout = self.layout(B)
        if group < 1 or B % group:
            raise BadInput(f"group={group} must be >= 1 and divide the {B} rows")
        runs = ids.reshape(B // group, group, -1), mask.reshape(B // group, group, -1)
        if any((x != x[:, :1]).any() for x in runs):
            raise BadInput(f"group={group}: rows are not runs of {group} copies of one prompt")
        prompt_layout = None if layout is None or group == 1 else self.layout(B // group)
        temperature = np.float32(1.0 if sampling.greedy else sampling.temperature)
        top_p = np.float32(sampling.top_p)
        stop = np.asarray(sampling.stop_tokens or (-1,), np.int32)  # -1 never matches a token
        prompts = (ids[::group], mask[::group])
        sample_ids = np.asarray(sample_ids, np.uint32)
        shared = (key, temperature, top_p, stop, np.int32(sampling.max_new_tokens))
        if layout is None:
            prompts, sample_ids, shared = jax.device_put((prompts, sample_ids, shared))
        else:
            prompts = jax.device_put(prompts, (prompt_layout or layout).rows)
            sample_ids, shared = jax.device_put(sample_ids, layout.rows), jax.device_put(shared, layout.replicated)
        (ids, mask), (key, temperature, top_p, stop, max_new) = prompts, shared
        state = prefill_prompts(
            self.graphdef, self.params, ids, mask, key, sample_ids, temperature, top_p, stop,
            gen_len=N_b, layout=layout, group=group, prompt_layout=prompt_layout, **static,
        )
        state = decode_tokens(
            self.graphdef, self.params, state, max_new, temperature, top_p, stop,
            prompt_len=P_b, layout=layout, **static,
        )
        return _finish(state.tokens, state.logprobs, stop, sampling.max_new_tokens)


@functools.partial(jax.jit, static_argnames=("n",))
def _finish(tokens, logprobs, stop_tokens, n) -> SampleOutput:
    tokens, logprobs = tokens[:, :n], logprobs[:, :n]
    mask = response_mask(tokens, stop_tokens)
    return SampleOutput(tokens, logprobs, mask, mask.sum(axis=1, dtype=jnp.int32))


def response_mask(tokens, stop_tokens) -> jax.Array:
    """True up to and including each row's first stop token (all True for unfinished rows)."""
    stop = jnp.isin(tokens, jnp.asarray(stop_tokens, jnp.int32))
    stops_before = jnp.cumsum(stop, axis=1) - stop
    return stops_before == 0


def generate(model, prompt_ids, prompt_mask, key, sampling: SamplingParams, sample_ids=None, pad_id: int = 0):
    """One-shot ``Sampler(model, pad_id=pad_id).generate(...)``."""
    return Sampler(model, pad_id=pad_id).generate(prompt_ids, prompt_mask, key, sampling, sample_ids)
