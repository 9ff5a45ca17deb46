"""The off-policy family's maths as pure functions on arrays: soft Q targets (SAC, CrossQ,
RLPD's REDQ-style random-subset minimum), ensemble critic regression, the actor and
temperature losses, Polyak averaging, and IQL's expectile value regression, Q backup and
advantage-weighted actor extraction.

Shapes: a Q ensemble's values are ``[N, B]`` (N members, B transitions); everything per
transition is ``[B]``. ``terminated`` is 1 where the episode ended by the task (no
bootstrap), 0 where it went on or was cut by a time limit (a truncated transition carries
the observation it ended on and bootstraps from it). No function here draws a random
number unless it takes a key.

Definitions and where they come from (see docs/algorithms.md):
- SAC (Haarnoja et al. 2018, "SAC algorithms and applications"): y = r + gamma (1 - d)
  (min_i Q'_i(s', a') - alpha log pi(a'|s')), a' ~ pi(.|s'); the critic regresses every
  member on y; the actor minimises alpha log pi(a|s) - Q(s, a) with Q the ensemble's
  minimum (or mean); the temperature minimises alpha (-log pi - H_target), as Brax and
  RLPD's code write it (the gradient in log alpha has the same sign as the paper's).
- REDQ (Chen et al. 2021), as RLPD uses it: the target's minimum runs over a random subset
  of ``num_min`` members, drawn anew per gradient step.
- IQL (Kostrikov et al. 2022): L_V = E[L2^tau(Q'(s, a) - V(s))] with the expectile loss
  L2^tau(u) = |tau - 1(u < 0)| u^2; L_Q = E[(r + gamma (1 - d) V(s') - Q(s, a))^2];
  the actor maximises E[exp(beta (Q'(s, a) - V(s))) log pi(a|s)] with the weight clipped
  at 100, as the authors' code does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def soft_q_target(reward, terminated, next_q, next_logprob, alpha, gamma: float):
    """``r + gamma (1 - d) (next_q - alpha log pi(a'|s'))``, gradients stopped; ``next_q``
    is already reduced over the ensemble (``[B]``)."""
    bootstrap = next_q - alpha * next_logprob
    return jax.lax.stop_gradient(reward + gamma * (1.0 - terminated) * bootstrap)


def ensemble_min(next_qs, key=None, num_min: int | None = None):
    """The minimum over the ensemble ``[N, B] -> [B]``; with ``key`` and ``num_min < N``,
    over ``num_min`` members drawn without replacement (REDQ), the same subset for the
    whole batch."""
    n = next_qs.shape[0]
    if key is None or num_min is None or num_min >= n:
        return jnp.min(next_qs, axis=0)
    members = jax.random.choice(key, n, (num_min,), replace=False)
    return jnp.min(next_qs[members], axis=0)


def ensemble_regression(q, target):
    """``0.5 * sum_i mean_b (Q_i - y)^2``: each member regresses on the same target, and
    summing over members keeps each member's gradient independent of the ensemble size."""
    return 0.5 * jnp.sum(jnp.mean(jnp.square(q - target[None]), axis=1))


def actor_loss(logprob, q, alpha, reduce: str = "min"):
    """``mean(alpha log pi(a|s) - Q(s, a))`` for fresh samples ``a``; ``q`` ``[N, B]`` is
    reduced by ``min`` (SAC, CrossQ) or ``mean`` (REDQ, RLPD)."""
    if reduce not in ("min", "mean"):
        raise ValueError(f"unknown ensemble reduction {reduce!r}; use min or mean")
    q_pi = jnp.min(q, axis=0) if reduce == "min" else jnp.mean(q, axis=0)
    return jnp.mean(jax.lax.stop_gradient(alpha) * logprob - q_pi)


def temperature_loss(log_alpha, logprob, target_entropy: float):
    """``mean(alpha (-log pi - H_target))`` with the log-prob held fixed: alpha grows while
    the policy's entropy is below the target and shrinks above it."""
    return jnp.mean(jnp.exp(log_alpha) * jax.lax.stop_gradient(-logprob - target_entropy))


def polyak(target, online, tau: float):
    """``(1 - tau) * target + tau * online``, leaf by leaf."""
    return jax.tree.map(lambda t, o: (1.0 - tau) * t + tau * o, target, online)


def expectile_loss(diff, expectile: float):
    """``|tau - 1(u < 0)| u^2`` per element: an asymmetric square; tau > 0.5 weighs
    positive residuals more, so the fit tracks an upper expectile."""
    weight = jnp.where(diff < 0, 1.0 - expectile, expectile)
    return weight * jnp.square(diff)


def iql_value_loss(q_target, value, expectile: float):
    """IQL's L_V: the expectile regression of V(s) on the (target) Q(s, a) of dataset actions."""
    return jnp.mean(expectile_loss(jax.lax.stop_gradient(q_target) - value, expectile))


def iql_q_target(reward, terminated, next_value, gamma: float):
    """IQL's backup ``r + gamma (1 - d) V(s')``, gradients stopped."""
    return jax.lax.stop_gradient(reward + gamma * (1.0 - terminated) * next_value)


def awr_weights(advantage, temperature: float, max_weight: float = 100.0):
    """``min(exp(beta A), max_weight)``, no gradient: advantage-weighted regression's weights."""
    return jax.lax.stop_gradient(jnp.minimum(jnp.exp(temperature * advantage), max_weight))


def awr_actor_loss(logprob, advantage, temperature: float, max_weight: float = 100.0):
    """``-mean(w log pi(a|s))`` over dataset actions, ``w`` from `awr_weights`."""
    return -jnp.mean(awr_weights(advantage, temperature, max_weight) * logprob)
