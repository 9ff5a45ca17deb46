"""Imitation losses and targets: what behaviour cloning, flow matching and a critic
warm-up optimise, as functions on arrays."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def token_nll(logits, target):
    """Mean negative log-likelihood of ``target`` ids ``[..., K]`` under ``logits``
    ``[..., K, V]`` and the greedy decode's accuracy: ``(loss, accuracy)``.

    For a VLA decoding an action chunk in parallel this is exactly the log-prob PPO later
    optimises, so the warm start and the RL objective agree."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, target[..., None], axis=-1)[..., 0]
    accuracy = jnp.mean((jnp.argmax(logits, axis=-1) == target).astype(jnp.float32))
    return jnp.mean(nll), accuracy


def discounted_returns(reward: np.ndarray, live: np.ndarray, gamma: float) -> np.ndarray:
    """``[B, T]`` rewards of episodes (``live`` marks steps before the end) -> the
    discounted return from each step to the episode's end."""
    out = np.zeros_like(reward, np.float32)
    acc = np.zeros(reward.shape[0], np.float32)
    for t in range(reward.shape[1] - 1, -1, -1):
        acc = np.where(live[:, t], reward[:, t] + gamma * acc, 0.0)
        out[:, t] = acc
    return out
