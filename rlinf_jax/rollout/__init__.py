"""Rollout loops: env unrolls (and, later, the LM sampler)."""

from rlinf_jax.rollout.env_rollout import Transition, evaluate_policy, unroll

__all__ = ["Transition", "unroll", "evaluate_policy"]
