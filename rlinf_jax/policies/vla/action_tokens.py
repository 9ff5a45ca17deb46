"""OpenVLA's discrete actions: continuous actions <-> token ids, and RL log-probs over them.

Binning follows OpenVLA exactly. Each normalised action dimension is clipped to [-1, 1] and
digitised against ``n_bins`` uniform edges (``linspace(-1, 1, n_bins)``), giving
``d in 1..n_bins``; the token is ``vocab_end - d``, so the action ids are the last
``n_bins`` ids before ``vocab_end`` in *reverse* bin order (Llama-2 OpenVLA:
``vocab_end = 32000``, ids 31744..31999, id 31999 the most negative bin). Decoding maps an
id back to one of the ``n_bins - 1`` bin centres (the two extreme ids share the end
centres, as in OpenVLA). ``vocab_end`` is the tokenizer's vocabulary size, not the
embedding table's (OpenVLA pads that to a multiple of 64).

Normalised actions are mapped back to the robot's range with per-dataset quantiles:
``a = 0.5 * (x + 1) * (q99 - q01) + q01`` on the dimensions ``mask`` selects (the gripper
is usually left as is).

RL log-probs are taken over the ``n_bins`` action ids only (a softmax restricted to them,
as RLinf does), since the policy can only ever emit those; per token ``[B, A]``, per action
(summed over the ``action_dim`` dimensions of each step) ``[B, A / action_dim]`` or per
chunk (summed over everything) ``[B]``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from rlinf_jax.errors import BadInput

LEVELS = ("token", "action", "chunk")


@dataclasses.dataclass(frozen=True)
class ActionTokenizer:
    vocab_end: int  # one past the last action id: the tokenizer's vocabulary size
    n_bins: int = 256
    low: float = -1.0
    high: float = 1.0

    def __post_init__(self):
        if self.n_bins < 2 or self.vocab_end < self.n_bins:
            raise BadInput(f"n_bins={self.n_bins} action ids do not fit below vocab_end={self.vocab_end}")

    @property
    def first_id(self) -> int:
        return self.vocab_end - self.n_bins

    @property
    def edges(self) -> np.ndarray:
        return np.linspace(self.low, self.high, self.n_bins)

    @property
    def centers(self) -> np.ndarray:
        e = self.edges
        return (e[:-1] + e[1:]) / 2.0

    def encode(self, actions) -> jax.Array | np.ndarray:
        """Normalised actions (any shape) -> token ids (int32, same shape).

        Concrete inputs are digitised on the host against float64 edges, exactly as OpenVLA
        (numpy) does; traced inputs against float32 edges, which can put a value lying
        exactly on an edge (to float32 precision) one bin higher.
        """
        if not isinstance(actions, jax.core.Tracer):
            x = np.clip(np.asarray(actions), self.low, self.high)
            return (self.vocab_end - np.digitize(x, self.edges)).astype(np.int32)
        x = jnp.clip(actions.astype(jnp.float32), self.low, self.high)
        # np.digitize(x, edges) for increasing edges: the number of edges <= x.
        d = jnp.searchsorted(jnp.asarray(self.edges, jnp.float32), x, side="right")
        return (self.vocab_end - d).astype(jnp.int32)

    def decode(self, ids: jax.Array) -> jax.Array:
        """Token ids -> normalised actions (bin centres), float32."""
        d = self.vocab_end - jnp.asarray(ids, jnp.int32)
        idx = jnp.clip(d - 1, 0, self.n_bins - 2)
        return jnp.take(jnp.asarray(self.centers, jnp.float32), idx)

    def bin_index(self, ids: jax.Array) -> jax.Array:
        """Position of each action id in the restricted ``[first_id, vocab_end)`` slice."""
        return jnp.asarray(ids, jnp.int32) - self.first_id

    def restrict(self, logits: jax.Array) -> jax.Array:
        """``logits[..., first_id:vocab_end]``: the action ids' logits, in id order."""
        return logits[..., self.first_id : self.vocab_end]


def _effective(temperature):
    return jnp.where(jnp.asarray(temperature) <= 0, 1.0, temperature)


def token_logprobs(tokenizer: ActionTokenizer, logits: jax.Array, ids: jax.Array, temperature=1.0) -> jax.Array:
    """log p(id) under ``softmax(restricted logits / temperature)``; logits ``[..., V]``,
    ids ``[...]`` action ids -> ``[...]`` float32. ``temperature <= 0`` (greedy) counts as 1,
    as in ``choose``."""
    lp = jax.nn.log_softmax(tokenizer.restrict(logits).astype(jnp.float32) / _effective(temperature), axis=-1)
    return jnp.take_along_axis(lp, tokenizer.bin_index(ids)[..., None], axis=-1)[..., 0]


def token_entropy(tokenizer: ActionTokenizer, logits: jax.Array, temperature=1.0) -> jax.Array:
    """Entropy of the restricted distribution at each position, ``[...]``."""
    lp = jax.nn.log_softmax(tokenizer.restrict(logits).astype(jnp.float32) / _effective(temperature), axis=-1)
    return -jnp.sum(jnp.exp(lp) * lp, axis=-1)


def reduce_logprobs(token_lp: jax.Array, action_dim: int, level: str) -> jax.Array:
    """Token log-probs ``[B, A]`` at ``level``: ``token`` ``[B, A]``, ``action`` ``[B, A //
    action_dim]`` (each step's dimensions summed), ``chunk`` ``[B]``."""
    if level not in LEVELS:
        raise BadInput(f"log-prob level {level!r} is unknown; choose one of {', '.join(LEVELS)}")
    if level == "token":
        return token_lp
    if level == "chunk":
        return jnp.sum(token_lp, axis=-1)
    B, A = token_lp.shape
    if A % action_dim:
        raise BadInput(f"{A} action tokens are not a whole number of {action_dim}-dimensional actions")
    return jnp.sum(token_lp.reshape(B, A // action_dim, action_dim), axis=-1)


def choose(tokenizer: ActionTokenizer, logits: jax.Array, key, temperature) -> tuple[jax.Array, jax.Array]:
    """Pick one action id per row from ``logits [B, V]``: greedy when ``temperature <= 0``,
    else sampled from ``softmax(restricted / temperature)``. Returns ``(ids [B], log-probs
    [B])``, the log-probs under the temperature-scaled distribution (temperature 1 for
    greedy rows), as the LM sampler reports them."""
    restricted = tokenizer.restrict(logits).astype(jnp.float32)
    greedy = jnp.asarray(temperature) <= 0
    lp = jax.nn.log_softmax(restricted / _effective(temperature), axis=-1)
    sampled = jax.random.categorical(key, lp, axis=-1)
    index = jnp.where(greedy, jnp.argmax(restricted, axis=-1), sampled)
    return (index + tokenizer.first_id).astype(jnp.int32), jnp.take_along_axis(lp, index[:, None], -1)[:, 0]


@dataclasses.dataclass(frozen=True)
class ActionStats:
    """Per-dataset action statistics (OpenVLA's ``norm_stats[dataset]["action"]``)."""

    q01: np.ndarray
    q99: np.ndarray
    mask: np.ndarray  # True: un-normalise this dimension

    @classmethod
    def from_norm_stats(cls, norm_stats: Mapping, dataset: str | None = None) -> ActionStats:
        if not norm_stats:
            raise BadInput("the checkpoint has no norm_stats; pass action statistics to un-normalise actions")
        if dataset is None:
            if len(norm_stats) != 1:
                raise BadInput(f"norm_stats cover several datasets ({', '.join(norm_stats)}); name one (unnorm_key)")
            dataset = next(iter(norm_stats))
        if dataset not in norm_stats:
            raise BadInput(f"dataset {dataset!r} has no norm_stats; available: {', '.join(norm_stats)}")
        stats = norm_stats[dataset].get("action", norm_stats[dataset])
        q01, q99 = (
            np.asarray(stats["q01"], np.float32),
            np.asarray(stats["q99"], np.float32),
        )
        mask = np.asarray(stats.get("mask", np.ones_like(q01, bool)), bool)
        if not q01.shape == q99.shape == mask.shape:
            raise BadInput(f"norm_stats of {dataset!r}: q01, q99 and mask differ in length")
        return cls(q01, q99, mask)

    @property
    def action_dim(self) -> int:
        return int(self.q01.shape[0])

    def unnormalize(self, x: jax.Array) -> jax.Array:
        """Normalised actions ``[..., action_dim]`` -> robot actions."""
        lo, hi = jnp.asarray(self.q01), jnp.asarray(self.q99)
        return jnp.where(jnp.asarray(self.mask), 0.5 * (x + 1.0) * (hi - lo) + lo, x)

    def normalize(self, a: jax.Array) -> jax.Array:
        """Robot actions -> [-1, 1] (the inverse on masked dimensions, clipped), for SFT targets."""
        lo, hi = jnp.asarray(self.q01), jnp.asarray(self.q99)
        x = jnp.clip(2.0 * (a - lo) / jnp.maximum(hi - lo, 1e-8) - 1.0, -1.0, 1.0)
        return jnp.where(jnp.asarray(self.mask), x, a)
