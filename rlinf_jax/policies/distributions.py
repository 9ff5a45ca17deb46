"""Action distributions as pure functions of their parameters.

The tanh-squashed Gaussian keeps actions in [-1, 1] (what Brax and MJX envs expect).
Log-probabilities are taken on the *raw* (pre-tanh) sample, with the tanh Jacobian,
so PPO ratios are exact and never hit atanh(+-1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_LOG_SQRT_2PI = 0.5 * jnp.log(2.0 * jnp.pi)


def normal_log_prob(loc, scale, x):
    z = (x - loc) / scale
    return jnp.sum(-0.5 * z * z - jnp.log(scale) - _LOG_SQRT_2PI, axis=-1)


def _tanh_log_det_jacobian(raw):
    # log(1 - tanh(x)^2) written stably: 2 * (log 2 - x - softplus(-2x)).
    return jnp.sum(2.0 * (jnp.log(2.0) - raw - jax.nn.softplus(-2.0 * raw)), axis=-1)


def tanh_normal_sample(loc, scale, key):
    """Returns the raw (pre-tanh) sample; the env action is ``jnp.tanh(raw)``.

    ``key`` is one key for the whole batch, or one key per row (shape ``[B, 2]`` for a
    ``[B, A]`` batch): per-row keys make each row's sample independent of how the batch
    was cut into micro-batches.
    """
    if key.ndim == loc.ndim:
        noise = jax.vmap(lambda k: jax.random.normal(k, loc.shape[1:], loc.dtype))(key)
    else:
        noise = jax.random.normal(key, loc.shape, loc.dtype)
    return loc + scale * noise


def tanh_normal_log_prob(loc, scale, raw):
    return normal_log_prob(loc, scale, raw) - _tanh_log_det_jacobian(raw)


def tanh_normal_entropy(loc, scale, key):
    """Entropy of the squashed Gaussian: Gaussian entropy plus E[log|d tanh|] (one sample)."""
    gaussian = jnp.sum(0.5 + _LOG_SQRT_2PI + jnp.log(scale), axis=-1)
    raw = tanh_normal_sample(loc, scale, key)
    return gaussian + _tanh_log_det_jacobian(raw)
