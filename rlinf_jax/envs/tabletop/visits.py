"""Episodes on the tabletop for imitation: the scripted expert's demonstrations, and the
states a policy visits labelled with what the expert would do there (DAgger's data).

Demonstrations come from training-split episodes (the envs an RL run then trains on, never
the test splits). Every record holds what the policy saw (``image``, ``tokens``,
``proprio``) and the expert's action chunk for that state (``action``).

Cloning the expert's own trajectories teaches the policy only the states the expert visits;
a policy a few millimetres off that path meets states it never saw and drifts (measured on
the tabletop: 11-12 cm from the object after the first chunk). DAgger (Ross et al., 2011)
rolls the current policy out, asks the expert what it would do in every state the policy
visited (the expert is a function of the sim state) and clones the aggregate of all rounds'
data, so the data covers the policy's own mistakes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlinf_jax.envs.tabletop.env import TabletopEnv
from rlinf_jax.envs.tabletop.episodes import episode_id
from rlinf_jax.envs.tabletop.expert import collect_demos, demo_dataset, expert_actions
from rlinf_jax.errors import BadInput

# What one demonstration step holds: the policy's observation parts and the expert's chunk.
STEP_KEYS = ("image", "tokens", "proprio", "action")
OBS_KEYS = STEP_KEYS[:3]


def chunks_per_episode(env) -> int:
    """Policy calls in one episode of the base `TabletopEnv` (the last chunk may be short)."""
    c = env.config
    return -(-c.max_steps // c.chunk_length)


def train_episode_ids(rng: np.random.Generator, num_envs: int) -> jax.Array:
    """``num_envs`` training-split episode ids drawn with ``rng`` (int32, on the device)."""
    return jnp.asarray(episode_id("train", rng.integers(0, 1 << 24, size=num_envs)), jnp.int32)


def tabletop_of(env, what: str) -> TabletopEnv:
    base = env.unwrapped
    if not isinstance(base, TabletopEnv):
        raise BadInput(f"{what} needs env.suite=tabletop (a scripted expert)")
    return base


def expert_demos(env, num_episodes: int, seed: int) -> dict[str, np.ndarray]:
    """Successful expert steps of ``num_episodes`` training episodes as numpy arrays
    ``[N, ...]`` (`STEP_KEYS`)."""
    base = tabletop_of(env, "a warm start or SFT of a VLA")
    # Episodes far from the ones reset(key) tends to draw first: the warm start should not
    # be a replay of the RL run's own first episodes.
    rng = np.random.default_rng(seed)
    collect = jax.jit(collect_demos, static_argnums=(0, 2))
    batches = [
        demo_dataset(collect(base, train_episode_ids(rng, base.config.num_envs), chunks_per_episode(base)))
        for _ in range(0, num_episodes, base.config.num_envs)
    ]
    data = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    if len(data["action"]) == 0:
        raise BadInput("the scripted expert solved none of the demo episodes; raise sft.num_demos")
    return data


def policy_visits(env, policy, graphdef, params, episode_ids, num_chunks: int, key, greedy: bool):
    """Roll ``policy`` out from ``env.reset_to(episode_ids)`` (the base `TabletopEnv`) for
    ``num_chunks`` chunks and label every visited state with the expert's chunk. Jittable.

    Returns records with axes ``[num_envs, num_chunks, ...]``: ``image``, ``tokens``,
    ``proprio`` (what the policy saw), ``action`` (the expert's chunk for that state),
    ``valid`` (the state came before the episode ended or succeeded), ``live`` (before the
    episode ended, success or not) and ``reward`` (the env's reward for the policy's
    chunk); and ``success`` ``[num_envs]``: whether the policy's own episode succeeded.
    """
    model = nnx.merge(graphdef, params)
    state = env.reset_to(episode_ids)
    n = state.reward.shape[0]

    def body(carry, k):
        state, finished, ended, succeeded = carry
        if greedy:
            act = policy.act_deterministic(model, state.obs)
        else:
            act = policy.act(model, state.obs, jax.random.split(k, n))[0]
        nxt = env.step(state, act)
        rec = {**state.obs, "action": expert_actions(env, state), "valid": ~finished, "live": ~ended, "reward": nxt.reward}
        succeeded = succeeded | (~finished & (nxt.info["success"] > 0))
        finished = finished | (nxt.done > 0) | (nxt.info["success"] > 0)
        ended = ended | (nxt.done > 0)
        return (nxt, finished, ended, succeeded), rec

    no = jnp.zeros(n, bool)
    (_, _, _, success), recs = jax.lax.scan(body, (state, no, no, no), jax.random.split(key, num_chunks))
    recs = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), recs)
    return {**recs, "success": success}


def policy_visitor(env, policy, graphdef, greedy: bool):
    """`policy_visits` on ``env``'s base `TabletopEnv` for whole episodes, jitted:
    ``(params, episode ids, key) -> records``."""
    base = tabletop_of(env, "DAgger and the critic warm-up")
    num_chunks = chunks_per_episode(base)
    return jax.jit(lambda p, ids, k: policy_visits(base, policy, graphdef, p, ids, num_chunks, k, greedy))


def visited_batches(env, visit, params, num_episodes: int, rng: np.random.Generator, key, first: int = 0):
    """``visit`` on ``num_episodes`` training-split episodes (rounded up to whole env
    batches) drawn with ``rng``; batch ``i`` samples with ``fold_in(key, first + i)``.
    Yields each batch's records on the host."""
    n = env.unwrapped.config.num_envs
    for i in range(-(-num_episodes // n)):
        yield jax.device_get(visit(params, train_episode_ids(rng, n), jax.random.fold_in(key, first + i)))


def dagger_capacity(env, num_steps: int, rounds: int, episodes: int) -> int:
    """Rows that ``num_steps`` demonstration steps plus ``rounds`` DAgger rounds of
    ``episodes`` episodes can fill at most (every chunk of every visited episode)."""
    c = env.unwrapped.config
    per_round = -(-episodes // c.num_envs) * c.num_envs * chunks_per_episode(env.unwrapped)
    return num_steps + rounds * per_round


def dagger_data(env, visit, params, num_episodes: int, seed: int):
    """``visit`` (a `policy_visitor`) on ``num_episodes`` training-split episodes drawn
    with ``seed``: ``(steps, success rate)``, the steps as numpy arrays ``[N, ...]`` like
    `expert_demos`'s (every valid visited state, whether or not the policy's episode
    succeeded)."""
    steps, success = [], []
    for host in visited_batches(env, visit, params, num_episodes, np.random.default_rng(seed), jax.random.PRNGKey(seed)):
        keep = np.asarray(host["valid"], bool)
        steps.append({k: np.asarray(host[k])[keep] for k in STEP_KEYS})
        success.append(np.asarray(host["success"], np.float32))
    data = {k: np.concatenate([s[k] for s in steps]) for k in steps[0]}
    return data, float(np.mean(np.concatenate(success)))
