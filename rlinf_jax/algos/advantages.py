"""Advantage estimators: pure functions on time-major arrays.

Shapes: rewards, values, dones, truncations, final_values are ``[T, B]``; last_value
is ``[B]``. ``values[t]`` is V(s_t); ``dones[t] = 1`` when the episode ended after step t
for any reason, and ``truncations[t] = 1`` when that end was a time limit, in which case
V(final observation) (``final_values[t]``) is bootstrapped instead of 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def gae(rewards, values, dones, last_value, gamma, lam, truncations=None, final_values=None):
    """Generalised advantage estimation (Schulman et al., 2016) with truncation bootstrap.

    next_value_t = V(s_{t+1}) (``last_value`` at t = T-1) when the episode goes on,
    V(final obs) when it was truncated, 0 when it terminated.
    delta_t = r_t + gamma * next_value_t - V(s_t)
    A_t = delta_t + gamma * lam * (1 - dones[t]) * A_{t+1};  returns = A + V.
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    values = jnp.asarray(values, jnp.float32)
    dones = jnp.asarray(dones, jnp.float32)
    last_value = jnp.asarray(last_value, jnp.float32)
    next_values = jnp.concatenate([values[1:], last_value[None]], axis=0)
    # Value of what follows step t: the next state, or nothing after an ending.
    bootstrap = next_values * (1.0 - dones)
    if truncations is not None:
        if final_values is None:
            raise ValueError("gae: truncations given without final_values")
        truncations = jnp.asarray(truncations, jnp.float32)
        bootstrap = bootstrap + truncations * jnp.asarray(final_values, jnp.float32)
    deltas = rewards + gamma * bootstrap - values

    def backward(carry, x):
        delta, done = x
        adv = delta + gamma * lam * (1.0 - done) * carry
        return adv, adv

    _, advantages = jax.lax.scan(
        backward, jnp.zeros_like(last_value), (deltas, dones), reverse=True
    )
    return advantages, advantages + values
