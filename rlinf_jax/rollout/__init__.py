"""Rollouts: env unrolls and evaluation loops, the LM sampler and its text I/O, dataset
scoring, DAPO's dynamic sampling, and the visits behaviour cloning and DAgger learn from."""

from rlinf_jax.rollout.env_rollout import (
    Transition,
    env_keys,
    env_step,
    episode_frames,
    evaluate_from,
    evaluate_policy,
    step_keys,
    unroll,
)

__all__ = ["Transition", "env_keys", "env_step", "episode_frames", "evaluate_from", "evaluate_policy", "step_keys", "unroll"]
