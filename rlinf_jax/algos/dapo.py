"""DAPO (Yu et al., 2025): the four parts of Decoupled clip and Dynamic sAmpling Policy Optimization.

1. Clip-higher: an asymmetric clip range, ``ppo_policy_loss(..., clip_low=0.2,
   clip_high=0.28)`` (``rlinf_jax.algos.losses``); there is no separate function.
2. Token-level policy-gradient loss: ``agg="token-mean"`` (sum over all valid tokens of
   the batch divided by their count), the default of ``ppo_policy_loss``.
3. Overlong reward shaping: ``rlinf_jax.rewards.shaping.overlong_penalty``, added to the
   outcome reward by the reward function (``reward.overlong_*``).
4. Dynamic sampling: ``informative_groups`` below marks prompt groups whose rewards are
   not all equal (an all-equal group has zero GRPO advantage, hence no gradient); the
   reasoning runner keeps sampling new groups, at most ``algorithm.lm.max_resample`` rounds,
   until the batch is full of informative ones
   (``rlinf_jax.rollout.dynamic_sampling.collect_informative_groups``).
"""

from __future__ import annotations

import jax.numpy as jnp

from rlinf_jax.algos.advantages import reward_groups


def informative_groups(rewards, group_size):
    """``[N // group_size]`` bool: True for groups whose rewards are not all equal.

    Per-sample mask: ``jnp.repeat(informative_groups(r, g), g)``.
    """
    g = reward_groups(rewards, group_size)
    return jnp.max(g, axis=1) != jnp.min(g, axis=1)
