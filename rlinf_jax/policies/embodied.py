"""What the embodied PPO trainer asks of a policy, so that one trainer (fused or staged,
on any placement) drives a Gaussian MLP on Brax and a vision-language-action model on the
tabletop scene alike.

A policy here is a small adapter object holding the static facts (sizes, config) and four
pure functions of an NNX model; the model itself is built once by ``build`` and then
travels as ``nnx.split`` state. Observations are any pytree with the env batch on the
leading axis (a flat vector for Brax, ``{"image", "tokens", "proprio"}`` for the
tabletop); the *stored action* is whatever the log-prob is defined on (the pre-tanh sample
for the Gaussian, the action-bin tokens for a VLA), which the env never sees.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
from flax import nnx

from rlinf_jax.errors import BadInput
from rlinf_jax.policies import mlp
from rlinf_jax.policies.vla.embodied import vla_policy
from rlinf_jax.policies.vla.gr00t_embodied import gr00t_policy
from rlinf_jax.policies.vla.pi0_embodied import pi0_policy, pi05_policy


class EmbodiedPolicy(Protocol):
    # Whether running mean/std normalisation of observations applies (flat vectors only).
    normalizable_observations: bool

    def build(self, rngs: nnx.Rngs) -> nnx.Module: ...

    def act(self, model, obs, keys) -> tuple[Any, Any, jax.Array]:
        """Samples with one key per env: ``(env action, stored action, log-prob [B])``."""

    # Optional: ``act_with_value(model, obs, keys)`` -> ``act``'s triple plus values ``[B]``,
    # for policies whose acting pass computes the value anyway (the VLA's value head). The
    # rollout then records them and the learner skips its critic pass over the trajectory.

    def act_deterministic(self, model, obs) -> Any:
        """The evaluation action (mode or greedy decode)."""

    def evaluate_actions(self, model, obs, stored_action, key) -> tuple[jax.Array, jax.Array, jax.Array]:
        """``(log-prob [N], entropy [N], value [N])`` of stored actions: the PPO loss's inputs."""

    def critic(self, model, obs) -> jax.Array:
        """Values ``[N]``."""


class GaussianMLPPolicy:
    """Tanh-Gaussian actor and a separate value MLP on flat observations (Brax's PPO)."""

    normalizable_observations = True

    def __init__(self, model_cfg, observation_size: int, action_size: int):
        self.cfg, self.observation_size, self.action_size = model_cfg, observation_size, action_size

    def build(self, rngs: nnx.Rngs) -> mlp.ActorCritic:
        m = self.cfg
        return mlp.ActorCritic(
            self.observation_size,
            self.action_size,
            m.policy_hidden_sizes,
            m.value_hidden_sizes,
            m.activation,
            m.min_std,
            m.init_log_std,
            rngs=rngs,
            compute_dtype=m.compute_dtype,
        )

    def act(self, model, obs, keys):
        return mlp.act(model, obs, keys)

    def act_deterministic(self, model, obs):
        return mlp.act_deterministic(model, obs)

    def evaluate_actions(self, model, obs, stored_action, key):
        return mlp.evaluate_actions(model, obs, stored_action, key)

    def critic(self, model, obs):
        return model.critic(obs)


def embodied_policy(cfg, env) -> EmbodiedPolicy:
    """The policy ``actor.model.kind`` names, sized for ``env``."""
    kind = cfg.actor.model.kind
    if kind not in POLICIES:
        raise BadInput(f"actor.model.kind={kind!r} is not known for embodied runs; use {', '.join(POLICIES)}")
    return POLICIES[kind](cfg, env)


def mlp_policy(cfg, env) -> GaussianMLPPolicy:
    return GaussianMLPPolicy(cfg.actor.model, env.observation_size, env.action_size)


POLICIES = {"mlp": mlp_policy, "vla": vla_policy, "pi0": pi0_policy, "pi05": pi05_policy, "gr00t": gr00t_policy}
