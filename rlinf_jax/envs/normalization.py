"""Running observation normalisation as pure functions.

The trainer keeps a `RunningStats` in its train state (so it is checkpointed and sharded
with everything else) and threads it through `update_stats` / `normalize`.

`update_stats` merges a batch with Chan et al.'s parallel form of Welford's algorithm,
so after any sequence of updates ``mean`` / `variance` equal numpy's ``mean`` / ``var``
(population, ddof=0) over every row seen, up to float32 rounding. ``count`` is float32
(like Brax's): exact up to 2**24 rows and only slightly rounded beyond, which merely
perturbs the merge weights of new batches.

`normalize` returns ``(obs - mean) / sqrt(var + eps)``, optionally clipped to
``[-clip, clip]``. Before any data is seen the variance reads as 1 and the mean as 0, so
normalising is the identity rather than a division by sqrt(eps).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from rlinf_jax.array_types import Array, Float


@struct.dataclass
class RunningStats:
    count: Float[Array, "*runs"]  # rows seen
    mean: Float[Array, "*runs size"]
    m2: Float[Array, "*runs size"]  # sum of squared deviations from the mean


def init_stats(size: int) -> RunningStats:
    return RunningStats(
        count=jnp.zeros((), jnp.float32),
        mean=jnp.zeros((size,), jnp.float32),
        m2=jnp.zeros((size,), jnp.float32),
    )


def update_stats(stats: RunningStats, batch_obs: jax.Array, mask: jax.Array | None = None) -> RunningStats:
    """Adds the rows of `batch_obs` ([..., size], any leading dims) to `stats`.

    `mask` ([...], the leading dims) selects rows; rows where it is 0 are ignored.
    """
    size = stats.mean.shape[-1]
    x = jnp.asarray(batch_obs, jnp.float32).reshape(-1, size)
    w = jnp.ones((x.shape[0],), jnp.float32) if mask is None else jnp.asarray(mask, jnp.float32).reshape(-1)
    n_b = jnp.sum(w)
    mean_b = jnp.sum(w[:, None] * x, axis=0) / jnp.maximum(n_b, 1.0)
    # Deviations from the batch's own mean keep float32 cancellation small.
    m2_b = jnp.sum(w[:, None] * jnp.square(x - mean_b), axis=0)

    n = stats.count + n_b
    frac_b = jnp.where(n > 0, n_b / jnp.maximum(n, 1.0), 0.0)
    delta = mean_b - stats.mean
    return RunningStats(
        count=n,
        mean=stats.mean + delta * frac_b,
        m2=stats.m2 + m2_b + jnp.square(delta) * stats.count * frac_b,
    )


def variance(stats: RunningStats) -> jax.Array:
    """Population variance of the rows seen; 1 before any row."""
    return jnp.where(stats.count > 0, stats.m2 / jnp.maximum(stats.count, 1.0), 1.0)


def normalize(stats: RunningStats, obs: jax.Array, eps: float = 1e-8, clip: float | None = None) -> jax.Array:
    out = (obs - stats.mean) / jnp.sqrt(variance(stats) + eps)
    if clip is not None:
        out = jnp.clip(out, -clip, clip)
    return out
