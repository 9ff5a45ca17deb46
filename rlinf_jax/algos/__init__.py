"""RL math shared by every workload: pure JAX functions on arrays with masks."""

from rlinf_jax.algos.advantages import (
    dr_grpo,
    gae,
    grpo,
    reinforce_pp,
    reinforce_pp_baseline,
    rloo,
)
from rlinf_jax.algos.dapo import informative_groups
from rlinf_jax.algos.losses import (
    aggregate,
    decoupled_ppo_loss,
    dual_clip_ppo_policy_loss,
    entropy_bonus,
    entropy_from_logits,
    kl_penalty,
    ppo_policy_loss,
    value_loss,
)
from rlinf_jax.algos.registry import (
    GROUP_ADVANTAGES,
    GROUP_OUTCOME_ADVANTAGES,
    TOKEN_ADVANTAGES,
    get_advantage,
    get_aggregation,
    get_kl,
    get_policy_loss,
    register_advantage,
    register_aggregation,
    register_kl,
    register_policy_loss,
)

__all__ = [
    "GROUP_ADVANTAGES",
    "GROUP_OUTCOME_ADVANTAGES",
    "TOKEN_ADVANTAGES",
    "aggregate",
    "decoupled_ppo_loss",
    "dr_grpo",
    "dual_clip_ppo_policy_loss",
    "entropy_bonus",
    "entropy_from_logits",
    "gae",
    "get_advantage",
    "get_aggregation",
    "get_kl",
    "get_policy_loss",
    "grpo",
    "informative_groups",
    "kl_penalty",
    "ppo_policy_loss",
    "register_advantage",
    "register_aggregation",
    "register_kl",
    "register_policy_loss",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "rloo",
    "value_loss",
]
