"""Rollout loops: env unrolls (and, later, the LM sampler)."""

from rlinf_jax.rollout.env_rollout import (
    Transition,
    env_keys,
    env_step,
    episode_frames,
    evaluate_policy,
    step_keys,
    unroll,
)

__all__ = ["Transition", "env_keys", "env_step", "episode_frames", "evaluate_policy", "step_keys", "unroll"]
