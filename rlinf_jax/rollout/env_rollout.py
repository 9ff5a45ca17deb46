"""Env rollout loops: `lax.scan` over `env.step` with a policy in the loop.

Only the policy runs per step. Values are computed afterwards in one batched call
(cheaper on every backend than a critic forward inside the loop), except where the
policy's acting pass yields them for free (a VLA's value head reads a hidden state the
action needs anyway); then the policy returns them and the transition carries them.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import struct

from rlinf_jax.array_types import Array, Float, Shaped
from rlinf_jax.envs.base import Env, EnvState


@struct.dataclass
class Transition:
    """One step of a batched rollout; stacked by the scan into ``[T, B, ...]``."""

    # *steps: [envs] for one step, [time, envs] once the scan stacks them (seeds: [seeds, ...]).
    obs: Float[Array, "*steps obs"] | dict[str, Array]  # observation acted on (raw, unnormalised)
    # The pre-squash sample the log-prob is defined on: [*steps, act] for a Gaussian policy;
    # a VLA's action tokens or a flow policy's stored chain carry their own axes.
    raw_action: Shaped[Array, "..."] | dict[str, Array]
    logprob: Float[Array, "*steps"]
    reward: Float[Array, "*steps"]
    done: Float[Array, "*steps"]
    truncated: Float[Array, "*steps"]
    # Observation an episode ended on (== next obs unless done); bootstraps truncations.
    final_obs: Float[Array, "*steps obs"] | dict[str, Array]
    # Finished-episode statistics, valid where done.
    episode_return: Float[Array, "*steps"]
    episode_length: Shaped[Array, "*steps"]  # int32 from the episode wrapper, float32 where it is absent
    # 1 where a finished episode reached the env's success condition (0 for envs without one).
    episode_success: Float[Array, "*steps"]
    # V(obs) from the acting pass, for policies that yield it (None: the learner computes it).
    value: Float[Array, "*steps"] | None = None


def env_keys(step_key: jax.Array, num_envs: int, first_env: int = 0) -> jax.Array:
    """One key per env, folded from the env's global index.

    Keys belong to envs, not to batches: a micro-batch holding envs 64..127 draws exactly
    the samples those envs draw in the full batch, so cutting a batch changes no number.
    """
    ids = first_env + jnp.arange(num_envs, dtype=jnp.uint32)
    return jax.vmap(jax.random.fold_in, (None, 0))(step_key, ids)


def step_keys(key: jax.Array, length: int) -> jax.Array:
    return jax.random.split(key, length)


def env_step(env: Env, state: EnvState, action: jax.Array, raw, logprob, value=None) -> tuple[EnvState, Transition]:
    """Steps the env and records the transition (the obs the action was taken from)."""
    nxt = env.step(state, action)
    info = nxt.info
    return nxt, Transition(
        obs=state.obs,
        raw_action=raw,
        logprob=logprob,
        reward=nxt.reward,
        done=nxt.done,
        truncated=nxt.truncated,
        final_obs=info.get("final_obs", nxt.obs),
        episode_return=info.get("episode_return", jnp.zeros_like(nxt.reward)),
        episode_length=info.get("episode_length", jnp.zeros_like(nxt.reward)),
        episode_success=info.get("episode_success", jnp.zeros_like(nxt.reward)),
        value=value,
    )


def unroll(
    env: Env,
    policy: Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array, jax.Array]],
    env_state: EnvState,
    key: jax.Array,
    length: int,
    first_env: int = 0,
) -> tuple[EnvState, Transition]:
    """Steps ``env`` ``length`` times; ``policy(obs, keys) -> (action, raw_action, logprob)``
    or ``(..., value)`` with one key per env (see `env_keys`); ``first_env`` is the global
    index of env 0."""
    num_envs = env_state.reward.shape[0]

    def step(state: EnvState, step_key):
        return env_step(env, state, *policy(state.obs, env_keys(step_key, num_envs, first_env)))

    return jax.lax.scan(step, env_state, step_keys(key, length))


def evaluate_policy(
    env: Env,
    policy: Callable[[jax.Array], jax.Array],
    key: jax.Array,
    max_steps: int,
    place: Callable[[EnvState], EnvState] = lambda s: s,
):
    """Runs one episode in every env (no auto-reset) and returns per-env (return, length,
    success), success being 1 where ``info["success"]`` was reached at some step (0 for
    envs without one).

    A `while_loop` stops as soon as every episode is over, so early failures are cheap.
    ``place`` pins the initial state's layout (e.g. shards the env batch over devices).
    """
    return evaluate_from(env, policy, place(env.reset(key)), max_steps)


def evaluate_from(env: Env, policy: Callable[[jax.Array], jax.Array], state: EnvState, max_steps: int):
    """`evaluate_policy` from the reset state ``state``: one episode per env."""
    zeros = jnp.zeros_like(state.reward)

    def cond(carry):
        _, _, alive, _, _, t = carry
        return (t < max_steps) & jnp.any(alive > 0)

    def body(carry):
        state, ret, alive, length, success, t = carry
        state = env.step(state, policy(state.obs))
        ret = ret + state.reward * alive
        length = length + alive
        reached = (state.info["success"] > 0).astype(ret.dtype) if "success" in state.info else zeros
        success = jnp.maximum(success, reached * alive)
        alive = alive * (1.0 - state.done)
        return state, ret, alive, length, success, t + 1

    init = (state, zeros, zeros + 1.0, zeros, zeros, 0)
    _, ret, _, length, success, _ = jax.lax.while_loop(cond, body, init)
    return ret, length, success


def episode_frames(env: Env, policy: Callable[[jax.Array], jax.Array], key: jax.Array, num_steps: int) -> jax.Array:
    """Camera images ``[num_steps + 1, B, H, W, 3]`` of one episode per env (no auto-reset):
    the first observation, then the one after each of ``num_steps`` policy steps."""
    state = env.reset(key)

    def step(state, _):
        nxt = env.step(state, policy(state.obs))
        return nxt, nxt.obs["image"]

    _, images = jax.lax.scan(step, state, None, length=num_steps)
    return jnp.concatenate([state.obs["image"][None], images])
