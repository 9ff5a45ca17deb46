"""The shape annotations of the runners' pytrees (`rlinf_jax.array_types`) hold on the real
states, transitions and batches the runners carry, alone and with seeds side by side, and a
field that breaks them is named."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from rlinf_jax.array_types import Array, Count, Float, ShapeMismatch, check
from rlinf_jax.replay import TransitionBatch
from rlinf_jax.rollout import env_rollout
from rlinf_jax.tasks.embodied.build import build_trainer as build_ppo
from rlinf_jax.tasks.offpolicy.run import build_trainer as build_offpolicy
from rlinf_jax.tasks.registry import load_run_config
from tests.conftest import TINY
from tests.test_offpolicy import TINY_SAC


@struct.dataclass
class _Env:
    obs: Float[Array, "*batch obs"]
    reward: Float[Array, "*batch"]
    step: Count


@struct.dataclass
class _Batch:
    obs: Float[Array, "n obs"]
    inner: _Env


def _env(envs=4, obs=3, dtype=jnp.float32):
    return _Env(obs=jnp.zeros((envs, obs), dtype), reward=jnp.zeros(envs), step=jnp.zeros((), jnp.int32))


def test_a_field_off_its_annotation_is_named_with_its_shape():
    check(_env())
    check(_Batch(obs=jnp.zeros((7, 3)), inner=_env()))  # nested: "obs" is 3 in both
    with pytest.raises(ShapeMismatch, match=r"_Env.obs: int32\[4, 3\] is not Float"):
        check(_env(dtype=jnp.int32))
    with pytest.raises(ShapeMismatch, match=r"_Env.reward: float32\[5\]"):  # *batch is [4] from obs
        check(_Env(obs=jnp.zeros((4, 3)), reward=jnp.zeros(5), step=jnp.zeros((), jnp.int32)))
    with pytest.raises(ShapeMismatch, match=r"_Batch.inner.obs: float32\[4, 2\]"):  # obs bound to 3 above it
        check(_Batch(obs=jnp.zeros((7, 3)), inner=_env(obs=2)))
    with pytest.raises(ShapeMismatch, match=r"\[1\] _Env.obs"):  # one name, one size, across the objects
        check(_env(obs=3), _env(obs=5))
    with pytest.raises(ShapeMismatch, match=r"_Env.step: float32\[\]"):
        check(_Env(obs=jnp.zeros((4, 3)), reward=jnp.zeros(4), step=jnp.zeros(())))


def _transitions(env, env_state, length=3):
    """A random policy's rollout: Transitions ``[time, envs]``."""
    def policy(obs, keys):
        action = jax.vmap(lambda k: jax.random.uniform(k, (env.action_size,), minval=-1, maxval=1))(keys)
        return action, action, jnp.zeros(obs.shape[0])

    return jax.jit(env_rollout.unroll, static_argnums=(0, 1, 4))(env, policy, env_state, jax.random.PRNGKey(0), length)[1]


@pytest.mark.parametrize("seeds", [None, "[0,1]"], ids=["alone", "seeds"])
def test_ppo_and_sac_states_match_their_annotations(seeds):
    more = [f"runner.seeds={seeds}"] if seeds else []
    ppo = build_ppo(load_run_config("ppo_brax", [*TINY, "cluster.component_placement=collocated", *more]))
    state = ppo.init()
    check(state)
    assert state.step.shape == (() if seeds is None else (2,))
    if seeds is None:  # the rollout's transitions and the env state bind "obs" alike
        env = ppo.algorithm.env
        steps = _transitions(env, state.env_state)
        assert steps.reward.shape == (3, env.num_envs)
        check(state, steps)
    cfg = load_run_config("sac_brax", [*TINY_SAC, *more])
    state = build_offpolicy(cfg).init()
    check(state)  # the replay ring's TransitionBatch included: [(seeds,) envs, time, ...]
    rows = state.replay.experience.reward.shape
    assert rows[: 1 if seeds is None else 2] == ((cfg.env.num_envs,) if seeds is None else (2, cfg.env.num_envs))


def test_a_sampled_transition_batch_matches_its_annotation():
    rng = np.random.default_rng(0)
    batch = TransitionBatch(obs=rng.normal(size=(8, 4)).astype(np.float32), action=np.zeros((8, 1), np.float32),
                            reward=np.zeros(8, np.float32), next_obs=np.zeros((8, 4), np.float32),
                            terminated=np.zeros(8, np.float32))
    check(jax.tree.map(jnp.asarray, batch))
    with pytest.raises(ShapeMismatch, match=r"TransitionBatch.next_obs: float32\[8, 5\]"):
        check(jax.tree.map(jnp.asarray, batch.replace(next_obs=np.zeros((8, 5), np.float32))))
