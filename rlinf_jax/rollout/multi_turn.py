"""Multi-turn rollouts: many episodes at once, model turns and environment observations
interleaved on one static KV cache that is kept between turns.

Each turn, every live episode generates until the tool-call stop string, its end token or
its turn budget; the environments then step on the host (`rlinf_jax.agents.step_batch`,
whose tool calls run in the worker pool); the observations of the episodes that go on are
prefilled after their turn, and the next turn decodes from there. Only new tokens are ever
prefilled: the conversation so far stays in the cache.

Cache layout (columns, the same for every row)::

    [prompt P][turn 0: N][obs 0: O][turn 1: N][obs 1: O] ... [turn T-1: N]

A row's turn ends at its own stop; the slots after it, and the observation slots of rows
that did not get one, are marked invalid in the key mask, so attention skips them and the
model's positions (the count of valid slots before a token, `CausalLM.hidden_states`) run
on without a gap: row b sees exactly its own compact conversation. Observations are
left-padded inside their block, so the block's last column is the last real token of every
row that goes on, and its logits give the next turn's first token.

Rows whose episodes ended leave the work: before each turn the live rows are gathered into
a smaller batch (its size rounded up by `bucket_length`, so a few shapes compile), cache and
mask included.

The tool-call stop string is matched as its own token sequence (the tail of the last
``len(stop)`` tokens, inside the decode loop): exact for the character tokenizer; a BPE
tokenizer that merges the string with neighbouring text would miss it and the turn runs to
its budget (then it is a format error, not a wrong result).

Randomness: row b's draw at step s of turn t is ``uniform(fold_in(fold_in(fold_in(key, t),
sample_ids[b]), s))``, whichever batch the row is gathered into.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlinf_jax.agents import CALL_CLOSE, step_batch
from rlinf_jax.agents.config import TurnLimits
from rlinf_jax.errors import BadInput
from rlinf_jax.rollout.sampler import Sampler, bucket_length, choose_token, token_uniforms


class Episodes(NamedTuple):
    """Right-padded to ``max_episode_tokens`` after each prompt."""

    tokens: np.ndarray  # [B, W] int32: model tokens and observation tokens, pad after
    loss_mask: np.ndarray  # [B, W] int32: 1 on model tokens, 0 on observations and padding
    valid: np.ndarray  # [B, W] int32: 1 on every real token (model or observation)
    logprobs: np.ndarray  # [B, W] float32: the sampler's log-prob of each model token, else 0
    turn_ids: np.ndarray  # [B, W] int32: the turn a token belongs to (its model part and its observation), -1 on padding
    rewards: np.ndarray  # [B] float32: the sum of the episode's step rewards
    turn_rewards: list  # per row, the reward of each of its turns
    num_turns: np.ndarray  # [B] int32
    texts: list  # per row, the model's turn texts
    infos: list  # per row, the environment's info dict of each turn
    truncated: np.ndarray  # [B] bool: ended by a budget (turns, tokens) rather than by the environment


@dataclass
class _Row:
    turn_tokens: list = field(default_factory=list)
    turn_logprobs: list = field(default_factory=list)
    obs_tokens: list = field(default_factory=list)
    texts: list = field(default_factory=list)
    infos: list = field(default_factory=list)
    rewards: list = field(default_factory=list)
    used: int = 0
    done: bool = False
    truncated: bool = False


def assemble(turn_tokens, obs_tokens, width: int, turn_logprobs=None, pad_id: int = 0):
    """One row of `Episodes` from its turns: ``turn_tokens[t]`` (the model's tokens of turn
    t) each followed by ``obs_tokens[t]`` (the observation after it; missing for the last).

    Returns ``(tokens, loss_mask, valid, logprobs, turn_ids)``, each ``[width]``.
    """
    tokens = np.full(width, pad_id, np.int32)
    loss = np.zeros(width, np.int32)
    valid = np.zeros(width, np.int32)
    logp = np.zeros(width, np.float32)
    turn = np.full(width, -1, np.int32)
    at = 0
    for t, model in enumerate(turn_tokens):
        obs = obs_tokens[t] if t < len(obs_tokens) else []
        if at + len(model) + len(obs) > width:
            raise ValueError(f"the episode's {at + len(model) + len(obs)} tokens exceed its width {width}")
        n = len(model)
        tokens[at : at + n], loss[at : at + n], valid[at : at + n], turn[at : at + n] = model, 1, 1, t
        if turn_logprobs is not None:
            logp[at : at + n] = turn_logprobs[t]
        at += n
        m = len(obs)
        tokens[at : at + m], valid[at : at + m], turn[at : at + m] = obs, 1, t
        at += m
    return tokens, loss, valid, logp, turn


# ---------------------------------------------------------------- jitted pieces


@functools.partial(jax.jit, static_argnames=("graphdef", "batch", "length", "dtype"))
def _empty(graphdef, params, *, batch, length, dtype):
    model = nnx.merge(graphdef, params)
    return model.init_cache(batch, length, dtype), jnp.zeros((batch, length), bool)


@functools.partial(jax.jit, static_argnames=("graphdef",), donate_argnames=("cache", "key_mask"))
def _extend(graphdef, params, cache, key_mask, ids, mask, col):
    """Write ``ids [B, T]`` (valid where ``mask``) into the cache at columns ``col ..``; the
    logits of the block's last column ``[B, V]``."""
    model = nnx.merge(graphdef, params)
    key_mask = jax.lax.dynamic_update_slice(key_mask, mask.astype(bool), (0, col))
    hidden, cache = model.hidden_states(ids, key_mask, cache=cache, cache_index=col)
    return model.logits(hidden[:, -1]), cache, key_mask


class _TurnState(NamedTuple):
    cache: object
    key_mask: jax.Array
    tokens: jax.Array  # [B, N]
    logprobs: jax.Array  # [B, N]
    tail: jax.Array  # [B, L] the last L tokens (stop-string match)
    done: jax.Array  # [B]
    lengths: jax.Array  # [B] tokens of this turn so far
    step: jax.Array


@functools.partial(
    jax.jit,
    static_argnames=("graphdef", "greedy", "top_k", "use_top_p", "pad_id"),
    donate_argnames=("cache", "key_mask"),
)
def _turn(
    graphdef, params, cache, key_mask, first_logits, col, live, limits, uniforms, temperature, top_p, stop_seq, eos,
    *, greedy, top_k, use_top_p, pad_id,
):
    """One model turn for every row: tokens at columns ``col .. col + N - 1``.

    ``live [B]``: rows that generate (the others' slots stay invalid); ``limits [B]``: the
    most tokens each row may take this turn. A row stops after ``eos``, after the stop
    sequence ``stop_seq [L]`` (``-1`` entries never match), or at its limit.
    """
    model = nnx.merge(graphdef, params)
    B, N = uniforms.shape
    L = stop_seq.shape[0]
    # The whole turn block is visible to live rows while they decode (a slot ahead of a
    # query is hidden by causality anyway); it is cut back to each row's length at the end.
    block = jnp.broadcast_to(live[:, None], (B, N))
    key_mask = jax.lax.dynamic_update_slice(key_mask, block, (0, col))

    def record(s: _TurnState, logits):
        u = jax.lax.dynamic_index_in_dim(uniforms, s.step, axis=1, keepdims=False)
        token, logp = choose_token(logits, u, temperature, top_p, greedy=greedy, top_k=top_k, use_top_p=use_top_p)
        going = ~s.done
        token = jnp.where(going, token, pad_id)
        logp = jnp.where(going, logp, 0.0)
        tail = jnp.concatenate([s.tail[:, 1:], token[:, None]], axis=1)
        stop = (token == eos) | jnp.all(tail == stop_seq[None], axis=1) | (s.step + 1 >= limits)
        return s._replace(
            tokens=jax.lax.dynamic_update_slice(s.tokens, token[:, None], (0, s.step)),
            logprobs=jax.lax.dynamic_update_slice(s.logprobs, logp[:, None], (0, s.step)),
            tail=tail,
            done=s.done | (going & stop),
            lengths=s.lengths + going.astype(jnp.int32),
            step=s.step + 1,
        )

    state = _TurnState(
        cache=cache, key_mask=key_mask,
        tokens=jnp.full((B, N), pad_id, jnp.int32), logprobs=jnp.zeros((B, N), jnp.float32),
        tail=jnp.full((B, L), -2, jnp.int32), done=~live, lengths=jnp.zeros((B,), jnp.int32),
        step=jnp.zeros((), jnp.int32),
    )
    state = record(state, first_logits)

    def cond(s):
        return (s.step < N) & ~jnp.all(s.done)

    def body(s):
        last = jax.lax.dynamic_slice_in_dim(s.tokens, s.step - 1, 1, axis=1)
        logits, cache = model(last, s.key_mask, cache=s.cache, cache_index=col + s.step - 1)
        return record(s._replace(cache=cache), logits[:, 0])

    state = jax.lax.while_loop(cond, body, state)
    # A token's keys enter the cache when it is fed to predict the next one; the rows that
    # stopped at the loop's last step have not fed their last token yet. One more feed
    # (its prediction unused) writes it; the other rows write a pad past their end.
    last = jax.lax.dynamic_slice_in_dim(state.tokens, state.step - 1, 1, axis=1)
    _, cache = model(last, state.key_mask, cache=state.cache, cache_index=col + state.step - 1)
    # The turn's slots past each row's last token hold nothing of its conversation.
    keep = (jnp.arange(N)[None] < state.lengths[:, None]) & live[:, None]
    key_mask = jax.lax.dynamic_update_slice(state.key_mask, keep, (0, col))
    return state.tokens, state.logprobs, state.lengths, cache, key_mask


@functools.partial(jax.jit, static_argnames=("length",))
def _grow(cache, key_mask, *, length):
    """The cache and its key mask with empty (invalid) columns appended up to ``length``."""
    extra = length - key_mask.shape[1]
    return cache.extend(extra), jnp.pad(key_mask, ((0, 0), (0, extra)))


_turn_uniforms = jax.jit(token_uniforms, static_argnames=("steps",))


@jax.jit
def _gather(tree, idx):
    return jax.tree.map(lambda x: x[idx], tree)


class MultiTurnRollout:
    """Runs episodes of text environments with a `Sampler`'s model and weights.

    ``tokenizer``: encodes observations and the stop string, decodes turns for the
    environments. ``limits``: the turn and token budgets. Sampling settings as the
    single-turn sampler's (``temperature`` 0 = greedy).
    """

    def __init__(self, sampler: Sampler, tokenizer, limits: TurnLimits, stop_string: str = CALL_CLOSE):
        self.sampler, self.tokenizer, self.limits = sampler, tokenizer, limits
        self.eos = int(tokenizer.eos_token_id)
        self.pad_id = sampler.pad_id
        stop = list(tokenizer.encode(stop_string, add_special_tokens=False)) if stop_string else []
        self.stop_seq = np.asarray(stop or [-1], np.int32)
        self.N = bucket_length(limits.max_turn_tokens, sampler.min_bucket)
        self.O = bucket_length(limits.max_observation_tokens, sampler.min_bucket)

    def columns(self, prompt_width: int) -> int:
        T = self.limits.max_turns
        return prompt_width + T * self.N + (T - 1) * self.O

    def run(self, envs, rows, key, *, encode=None, temperature=1.0, top_p=1.0, top_k=0, sample_ids=None) -> Episodes:
        """``envs[b]`` is reset with ``rows[b]``; ``encode(texts) -> [token ids]`` turns the
        first observations into prompts (the caller's template and encoder; default: the
        tokenizer's plain encoding)."""
        B = len(envs)
        if len(rows) != B:
            raise ValueError(f"{B} environments but {len(rows)} rows")
        first = [env.reset(row) for env, row in zip(envs, rows)]
        if encode is None:
            prompt_ids = [list(self.tokenizer.encode(t, add_special_tokens=False)) for t in first]
        else:
            prompt_ids = [list(p) for p in encode(first)]
        lim, N, O = self.limits, self.N, self.O
        sampler = self.sampler
        sample_ids = np.arange(B) if sample_ids is None else np.asarray(sample_ids)
        P = bucket_length(max(map(len, prompt_ids)), sampler.min_bucket)
        S = self.columns(P)
        greedy = temperature == 0
        static = {"greedy": greedy, "top_k": int(top_k), "use_top_p": top_p < 1.0, "pad_id": self.pad_id}
        temp = np.float32(1.0 if greedy else temperature)
        top_p = np.float32(top_p)
        graphdef, params = sampler.graphdef, sampler.params

        def span(t: int) -> int:
            # Columns in use up to the end of turn t's observation. The cache grows turn by
            # turn rather than starting at S: every decode step's attention runs over all of
            # its columns (benchmarks/README.md, multiturn_rollout).
            return min(S, bucket_length(P + (t + 1) * (N + O), sampler.min_bucket))

        state = [_Row() for _ in range(B)]
        dtype = jax.tree.leaves(params)[0].dtype
        cache, key_mask = _empty(graphdef, params, batch=B, length=span(0), dtype=dtype)
        ids, mask = _left_pad(prompt_ids, P, self.pad_id)
        logits, cache, key_mask = _extend(graphdef, params, cache, key_mask, ids, mask, np.int32(0))
        members = np.arange(B)  # full-batch row of each row of the working batch

        for t in range(lim.max_turns):
            live_rows = [b for b in range(B) if not state[b].done]
            if not live_rows:
                break
            # Rows that finished leave the work: gather the live ones (padded to a bucket).
            width = min(bucket_length(len(live_rows), 8), B) if len(live_rows) < len(members) else len(members)
            if width < len(members) or not np.array_equal(members[: len(live_rows)], live_rows):
                pos = {m: i for i, m in enumerate(members)}
                pick = [pos[b] for b in live_rows] + [pos[live_rows[0]]] * (width - len(live_rows))
                cache, key_mask, logits = _gather((cache, key_mask, logits), np.asarray(pick))
                members = np.asarray(live_rows + [live_rows[0]] * (width - len(live_rows)))
            live = np.zeros(len(members), bool)
            live[: len(live_rows)] = True
            limits = np.asarray(
                [min(lim.max_turn_tokens, lim.max_episode_tokens - state[b].used) for b in members], np.int32
            )
            col = P + t * (N + O)
            need = span(t)
            if key_mask.shape[1] < need:
                cache, key_mask = _grow(cache, key_mask, length=need)
            uniforms = _turn_uniforms(jax.random.fold_in(key, t), jnp.asarray(sample_ids[members], jnp.uint32), steps=N)
            tokens, logps, lengths, cache, key_mask = _turn(
                graphdef, params, cache, key_mask, logits, np.int32(col), live, limits, uniforms, temp, top_p,
                self.stop_seq, np.int32(self.eos), **static,
            )
            tokens, logps, lengths = np.asarray(tokens), np.asarray(logps), np.asarray(lengths)
            texts, envs_now = [], []
            for i, b in enumerate(live_rows):
                row = state[b]
                row.turn_tokens.append(tokens[i, : lengths[i]].tolist())
                row.turn_logprobs.append(logps[i, : lengths[i]])
                row.used += int(lengths[i])
                texts.append(self.tokenizer.decode(row.turn_tokens[-1], skip_special_tokens=True))
                envs_now.append(envs[b])
            results = step_batch(envs_now, texts)
            obs_lists: dict[int, list[int]] = {}
            for i, (b, res) in enumerate(zip(live_rows, results)):
                row = state[b]
                row.texts.append(texts[i])
                row.infos.append(res.info)
                row.rewards.append(float(res.reward))
                if res.done:
                    row.done = True
                    continue
                obs = list(self.tokenizer.encode(res.observation, add_special_tokens=False))[: lim.max_observation_tokens]
                # The episode ends when its next turn could not start: no turns or tokens left.
                if t + 1 >= lim.max_turns or row.used + len(obs) >= lim.max_episode_tokens or not obs:
                    row.done = row.truncated = True
                    continue
                row.obs_tokens.append(obs)
                row.used += len(obs)
                obs_lists[i] = obs
            if not obs_lists:
                break
            obs_ids, obs_mask = _left_pad([obs_lists.get(i, []) for i in range(len(members))], O, self.pad_id)
            logits, cache, key_mask = _extend(graphdef, params, cache, key_mask, obs_ids, obs_mask, np.int32(col + N))
            for i, b in enumerate(live_rows):
                if i not in obs_lists:
                    state[b].done = True

        W = lim.max_episode_tokens
        out = [assemble(r.turn_tokens, r.obs_tokens, W, r.turn_logprobs, self.pad_id) for r in state]
        tokens, loss, valid, logp, turn = (np.stack(x) for x in zip(*out))
        return Episodes(
            tokens=tokens, loss_mask=loss, valid=valid, logprobs=logp, turn_ids=turn,
            rewards=np.asarray([sum(r.rewards) for r in state], np.float32),
            turn_rewards=[r.rewards for r in state],
            num_turns=np.asarray([len(r.turn_tokens) for r in state], np.int32),
            texts=[r.texts for r in state], infos=[r.infos for r in state],
            truncated=np.asarray([r.truncated for r in state], bool),
        )


def _left_pad(seqs, width: int, pad_id: int):
    ids = np.full((len(seqs), width), pad_id, np.int32)
    mask = np.zeros((len(seqs), width), bool)
    for r, s in enumerate(seqs):
        if len(s) > width:
            raise BadInput(f"a sequence of {len(s)} tokens does not fit its block of {width}")
        if s:
            ids[r, width - len(s) :] = s
            mask[r, width - len(s) :] = True
    return ids, mask


def episode_metrics(ep: Episodes, prefix: str = "agent") -> dict:
    """Per-episode means: turns, tool calls, tool errors (raised, unknown tool, timed out),
    format errors (malformed calls), truncated episodes, model tokens generated and
    observation tokens read."""
    n = max(len(ep.infos), 1)

    def count(key):
        return sum(bool(i.get(key)) for infos in ep.infos for i in infos) / n

    generated = ep.loss_mask.sum(axis=1)
    observed = ep.valid.sum(axis=1) - generated
    return {
        f"{prefix}/turns": float(ep.num_turns.mean()),
        f"{prefix}/tool_calls": count("tool_call"),
        f"{prefix}/tool_errors": count("tool_error"),
        f"{prefix}/tool_timeouts": count("timeout"),
        f"{prefix}/format_errors": count("format_error"),
        f"{prefix}/truncated": float(ep.truncated.mean()),
        f"{prefix}/tokens_generated": float(generated.mean()),
        f"{prefix}/tokens_observed": float(observed.mean()),
    }
