"""Algorithms selected by name from config (``algorithm.adv_type`` / ``algorithm.loss_type``)."""

from __future__ import annotations

from collections.abc import Callable

from rlinf_jax.algos import advantages, losses
from rlinf_jax.errors import BadInput

ADVANTAGES: dict[str, Callable] = {"gae": advantages.gae}
POLICY_LOSSES: dict[str, Callable] = {"ppo": losses.ppo_policy_loss}


def register_advantage(name: str):
    def wrap(fn):
        ADVANTAGES[name] = fn
        return fn

    return wrap


def register_policy_loss(name: str):
    def wrap(fn):
        POLICY_LOSSES[name] = fn
        return fn

    return wrap


def _lookup(table, kind, key, name):
    if name not in table:
        raise BadInput(f"{key}={name!r} is not a known {kind}; choose one of {sorted(table)}")
    return table[name]


def get_advantage(name: str) -> Callable:
    return _lookup(ADVANTAGES, "advantage estimator", "algorithm.adv_type", name)


def get_policy_loss(name: str) -> Callable:
    return _lookup(POLICY_LOSSES, "policy loss", "algorithm.loss_type", name)
