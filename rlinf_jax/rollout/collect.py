"""Collecting transitions with a policy: demonstrations for RLPD, datasets for IQL.

`collect` steps a batched, auto-resetting env with ``policy`` for ``num_steps`` steps in
one `lax.scan` and returns every transition, time-major, with what a dataset records
besides the `TransitionBatch` (time-limit flags, episode ids). The first ``num_random``
envs act uniformly at random instead: a dataset with a known mix of good and bad
episodes, what offline RL is tested on.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from rlinf_jax.envs.base import Env
from rlinf_jax.replay import TransitionBatch
from rlinf_jax.rollout.env_rollout import env_keys, step_keys


def collect(env: Env, policy: Callable, key, num_steps: int, num_random: int = 0):
    """``(TransitionBatch [T * B], timeouts [T * B], episode ids [T * B], finished-episode
    returns)`` of ``num_steps`` steps of the ``B`` envs; ``policy(obs, per-env keys) -> env
    action``. Episode ids are unique: env ``i``'s ``k``-th episode is ``i + k * B``."""
    reset_key, run_key = jax.random.split(key)
    state = jax.jit(env.reset)(reset_key)
    num_envs = env.num_envs
    random_rows = (jnp.arange(num_envs) < num_random)[:, None]

    def step(carry, k):
        state, episode = carry
        keys = env_keys(k, num_envs)
        action = policy(state.obs, keys)
        uniform = jax.vmap(lambda kk: jax.random.uniform(jax.random.fold_in(kk, 7), action.shape[1:], action.dtype,
                                                         -1.0, 1.0))(keys)
        action = jnp.where(random_rows, uniform, action)
        nxt = env.step(state, action)
        info = nxt.info
        record = {
            "obs": state.obs,
            "action": action,
            "reward": nxt.reward,
            "next_obs": info.get("final_obs", nxt.obs),
            "terminated": nxt.done * (1.0 - nxt.truncated),
            "timeout": nxt.truncated,
            "episode": episode,
            "done": nxt.done,
            "episode_return": info.get("episode_return", jnp.zeros_like(nxt.reward)),
        }
        episode = episode + jnp.where(nxt.done > 0, num_envs, 0)
        return (nxt, episode), record

    def run(state, keys):
        return jax.lax.scan(step, (state, jnp.arange(num_envs, dtype=jnp.int32)), keys)[1]

    out = jax.device_get(jax.jit(run)(state, step_keys(run_key, num_steps)))
    out = jax.tree.map(lambda x: np.asarray(x).reshape(num_steps * num_envs, *x.shape[2:]), out)
    batch = TransitionBatch(out["obs"], out["action"], out["reward"], out["next_obs"], out["terminated"])
    returns = out["episode_return"][out["done"] > 0]
    return batch, out["timeout"], out["episode"], returns
