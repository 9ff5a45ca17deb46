"""RL math shared by every workload: pure JAX functions on arrays with masks."""

from rlinf_jax.algos.advantages import gae
from rlinf_jax.algos.losses import entropy_bonus, ppo_policy_loss, value_loss
from rlinf_jax.algos.registry import get_advantage, get_policy_loss

__all__ = ["gae", "ppo_policy_loss", "value_loss", "entropy_bonus", "get_advantage", "get_policy_loss"]
