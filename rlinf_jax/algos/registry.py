"""Algorithms selected by name from config.

``algorithm.adv_type`` -> ``ADVANTAGES``, ``algorithm.loss_type`` -> ``POLICY_LOSSES``,
``algorithm.lm.kl_type`` -> ``KL_KINDS``, ``algorithm.lm.loss_agg`` -> ``AGGREGATIONS``.
Adding an algorithm is one function plus one line: either an entry in a table below or
``@register_advantage("name")`` (etc.) on the function.
"""

from __future__ import annotations

from collections.abc import Callable

from rlinf_jax.algos import advantages, losses
from rlinf_jax.errors import BadInput

ADVANTAGES: dict[str, Callable] = {
    "gae": advantages.gae,
    "grpo": advantages.grpo,
    "dr_grpo": advantages.dr_grpo,
    "rloo": advantages.rloo,
    "reinforce_pp": advantages.reinforce_pp,
    "reinforce_pp_baseline": advantages.reinforce_pp_baseline,
}
# Estimators that give one advantage per response (or episode) from its group's outcomes.
GROUP_OUTCOME_ADVANTAGES = ("grpo", "dr_grpo", "rloo")
# Estimators that compare the members of a group at all: a group needs two of them.
GROUP_ADVANTAGES = (*GROUP_OUTCOME_ADVANTAGES, "reinforce_pp_baseline")
# Token-level REINFORCE++ estimators (token rewards, discounted reward-to-go).
TOKEN_ADVANTAGES = ("reinforce_pp", "reinforce_pp_baseline")

POLICY_LOSSES: dict[str, Callable] = {
    "ppo": losses.ppo_policy_loss,
    "dual_clip_ppo": losses.dual_clip_ppo_policy_loss,
    "decoupled_ppo": losses.decoupled_ppo_loss,
}
# Shared with losses.kl_penalty / losses.aggregate, which dispatch through them.
KL_KINDS: dict[str, Callable] = losses.KL_KINDS
AGGREGATIONS: dict[str, Callable] = losses.AGGREGATIONS


def _register(table):
    def register(name: str):
        def wrap(fn):
            table[name] = fn
            return fn

        return wrap

    return register


register_advantage = _register(ADVANTAGES)
register_policy_loss = _register(POLICY_LOSSES)
register_kl = _register(KL_KINDS)  # fn(d) with d = logp - ref_logp, per token
register_aggregation = _register(AGGREGATIONS)  # fn(x, mask, max_len) -> scalar


def _lookup(table, kind, key, name):
    if name not in table:
        raise BadInput(f"{key}={name!r} is not a known {kind}; choose one of {sorted(table)}")
    return table[name]


def get_advantage(name: str) -> Callable:
    return _lookup(ADVANTAGES, "advantage estimator", "algorithm.adv_type", name)


def get_policy_loss(name: str) -> Callable:
    return _lookup(POLICY_LOSSES, "policy loss", "algorithm.loss_type", name)


def get_kl(name: str) -> Callable:
    """The per-token KL function of d = logp - ref_logp; or call ``kl_penalty(logp, ref, name)``."""
    return _lookup(KL_KINDS, "KL estimator", "algorithm.lm.kl_type", name)


def get_aggregation(name: str) -> Callable:
    """The reducer fn(x, mask, max_len); or call ``aggregate(x, mask, name)``."""
    return _lookup(AGGREGATIONS, "aggregation", "algorithm.lm.loss_agg", name)
