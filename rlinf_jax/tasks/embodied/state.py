"""What an embodied run carries from iteration to iteration, and what its checkpoints hold."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from rlinf_jax.array_types import Count, Key
from rlinf_jax.envs import normalization
from rlinf_jax.envs.base import Env, EnvState


@struct.dataclass
class TrainState:
    params: Any
    opt_state: Any
    obs_stats: normalization.RunningStats
    env_state: EnvState
    key: Key
    step: Count
    # Consecutive iterations in which some update was skipped for a non-finite loss/grad.
    bad_iterations: Count


@struct.dataclass
class StaleTrainState(TrainState):
    """The state of a stale run (flow.max_staleness=1): also the parameters and observation
    statistics its next rollout acts with (those of the start of the previous iteration),
    so its checkpoint resumes it exactly. An on-policy state, and its checkpoint, hold no
    second copy of the parameters."""

    acting: Any

    @classmethod
    def around(cls, ts: TrainState, acting) -> StaleTrainState:
        return cls(**{f.name: getattr(ts, f.name) for f in dataclasses.fields(TrainState)}, acting=acting)


def stats_size(env: Env, normalizable: bool) -> int:
    """Size of the observation statistics: structured observations are never normalised,
    and a one-element placeholder keeps the state's shape the same for every policy."""
    return env.observation_size if normalizable else 1


def fresh_state(seed: int, env: Env, normalizable: bool, params, tx, env_state=None) -> TrainState:
    """The state of step 0 around ``params``: new optimiser state, reset envs (``env_state``
    given: a host simulator's, whose envs reset in their workers), the seed's key."""
    key = jax.random.PRNGKey(seed)
    key, reset_key = jax.random.split(key)
    env_state = jax.jit(env.reset)(reset_key) if env_state is None else env_state
    return TrainState(
        params=params,
        opt_state=tx.init(params),
        obs_stats=normalization.init_stats(stats_size(env, normalizable)),
        env_state=env_state,
        key=key,
        step=jnp.zeros((), jnp.int32),
        bad_iterations=jnp.zeros((), jnp.int32),
    )
