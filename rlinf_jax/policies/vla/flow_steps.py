"""One denoising step of a flow-matching policy as a Gaussian, for RL log-probs.

Convention (openpi, transformers' PI0): ``x_t = t * noise + (1 - t) * action``, the model
predicts the velocity ``v = noise - action``, and sampling integrates from ``t = 1`` (noise)
to ``t = 0`` (action) in ``N`` Euler steps of size ``delta = 1 / N`` at times
``t_k = 1 - k / N``. A deterministic step is ``x - delta * v``; RL needs a density, so the
policies make steps Gaussian, ``x_{k+1} ~ N(mean_k, std_k^2)``, in one of two ways (the
piRL paper; RLinf's ``flow_sde`` and ``flow_noise``):

- **flow-SDE**: the ODE is swapped for the SDE with the same marginals,
  ``dx = [v + sigma_t^2 / (2t) * (x + (1 - t) v)] dt + sigma_t dW`` with
  ``sigma_t = a * sqrt(t / (1 - t))`` (``a`` = ``noise_level``; at ``t = 1`` the denominator
  uses ``1 - t_1`` to stay finite). Its Euler-Maruyama step has
  ``mean = x - delta * v - sigma^2 * delta / (2t) * (x + (1 - t) v)`` and
  ``std = sqrt(delta) * sigma``. Only one randomly chosen step per sample is stochastic (the
  others stay deterministic), and that step's log-density is the action's log-prob.
- **flow-noise**: the Euler mean stays, and a learned head gives ``std`` per element at every
  step; the log-prob is the sum over the N steps (the likelihood of the whole denoising chain,
  leaving out the initial noise's, which no parameter changes).

All functions are elementwise over ``[..., horizon, action_dim]`` arrays and run in float32.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

FLOW_SDE = "flow_sde"
FLOW_NOISE = "flow_noise"
METHODS = (FLOW_SDE, FLOW_NOISE)


def step_times(num_steps: int) -> np.ndarray:
    """``t_k = 1 - k / N`` for ``k = 0..N-1`` in float32, computed as transformers' PI0 does
    (``1 + k * (-1 / N)`` in float64, then rounded)."""
    return (1.0 + np.arange(num_steps) * (-1.0 / num_steps)).astype(np.float32)


def sde_sigmas(num_steps: int, noise_level: float) -> np.ndarray:
    """``sigma_k = a * sqrt(t_k / (1 - t_k))`` per step (float32), ``1 - t_1`` standing in
    for ``1 - t_0 = 0``."""
    t = 1.0 - np.arange(num_steps, dtype=np.float64) / num_steps
    denom = 1.0 - np.where(t == 1.0, 1.0 - 1.0 / num_steps, t)
    return (noise_level * np.sqrt(t / denom)).astype(np.float32)


def sde_step(
    x: jax.Array, v: jax.Array, t, delta, sigma
) -> tuple[jax.Array, jax.Array]:
    """(mean, std) of the flow-SDE step from time ``t`` to ``t - delta`` (``sigma = 0`` gives
    the Euler step ``x - delta * v`` with std 0)."""
    x, v = x.astype(jnp.float32), v.astype(jnp.float32)
    drift_fix = sigma**2 * delta / (2.0 * t)
    mean = x - delta * v - drift_fix * (x + (1.0 - t) * v)
    std = jnp.broadcast_to(jnp.sqrt(delta) * sigma, x.shape).astype(jnp.float32)
    return mean, std


def gaussian_logprob(x: jax.Array, mean: jax.Array, std: jax.Array) -> jax.Array:
    """Elementwise ``log N(x; mean, std^2)``; 0 where ``std == 0`` (a deterministic step
    contributes nothing)."""
    std = std.astype(jnp.float32)
    deterministic = std == 0
    safe = jnp.where(deterministic, 1.0, std)
    z = (x.astype(jnp.float32) - mean) / safe
    logp = -0.5 * z * z - jnp.log(safe) - 0.5 * math.log(2.0 * math.pi)
    return jnp.where(deterministic, 0.0, logp)


def gaussian_entropy(std: jax.Array) -> jax.Array:
    """Elementwise entropy ``0.5 * log(2 pi e std^2)`` of the step Gaussian."""
    return 0.5 * math.log(2.0 * math.pi * math.e) + jnp.log(std.astype(jnp.float32))
