"""Policy and value losses as pure functions of arrays (masks optional).

Conventions: ``logprob`` and ``old_logprob`` are log pi(a|s) of the taken actions;
``advantages`` are already computed (and normalised, if wanted) by the caller.
"""

from __future__ import annotations

import jax.numpy as jnp


def _masked_mean(x, mask):
    if mask is None:
        return jnp.mean(x)
    mask = jnp.asarray(mask, x.dtype)
    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def ppo_policy_loss(logprob, old_logprob, advantages, clip_eps, mask=None):
    """Clipped surrogate: -mean(min(rho * A, clip(rho, 1-eps, 1+eps) * A)), rho = pi/pi_old.

    Returns (loss, metrics) with the clip fraction and the approximate KL
    (mean of (rho - 1) - log rho, non-negative and low-variance).
    """
    log_ratio = logprob - old_logprob
    ratio = jnp.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    loss = -_masked_mean(jnp.minimum(unclipped, clipped), mask)
    clip_frac = _masked_mean((jnp.abs(ratio - 1.0) > clip_eps).astype(jnp.float32), mask)
    approx_kl = _masked_mean((ratio - 1.0) - log_ratio, mask)
    return loss, {"clip_frac": clip_frac, "approx_kl": approx_kl}


def value_loss(values, returns, mask=None, old_values=None, clip_eps=None):
    """0.5 * mean((V - R)^2); with ``clip_eps``, the PPO2 clipped variant max(unclipped, clipped)."""
    err = jnp.square(values - returns)
    if clip_eps is not None and old_values is not None:
        v_clipped = old_values + jnp.clip(values - old_values, -clip_eps, clip_eps)
        err = jnp.maximum(err, jnp.square(v_clipped - returns))
    return 0.5 * _masked_mean(err, mask)


def entropy_bonus(entropy, mask=None):
    """Mean entropy; the caller subtracts coef * this from the loss."""
    return _masked_mean(entropy, mask)
