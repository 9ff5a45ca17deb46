"""The scripted expert and the demonstrations it produces for SFT warm starts.

The expert reads the simulator state (privileged: true positions, what the gripper holds)
and plays a fixed script: over the object at a safe height, down, close, lift, over the
target pad, down, open, then up. Each action is a proportional step towards the script's
current waypoint, so it corrects itself when the servo lags or the object is moved (the
execution split). A chunk is planned by running the expert through the env's own
sub-steps, so the K actions it returns are the ones it would take step by step.

`collect_demos` rolls the expert out from given episode ids inside one `jit` and records
what a policy sees (image, instruction tokens, proprioception) with the chunk it should
output; `demo_dataset` flattens that to per-step arrays on the host.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rlinf_jax.envs.base import EnvState
from rlinf_jax.envs.tabletop import dynamics, scene
from rlinf_jax.envs.tabletop.dynamics import TabletopSim

HOVER = 0.06  # approach height above the object's centre
CARRY = 0.07  # carrying height of the object's centre above its resting height
XY_TOL = 0.008  # close enough in the plane to start descending
GRASP_TOL = 0.012  # close enough to the centre to close the gripper


def expert_action(sim: TabletopSim) -> jax.Array:
    """One env's next action [7] (rotation dims 0)."""
    slot = dynamics.obj_slot(sim.spec)
    obj = dynamics.objects(sim)[slot]
    rest = jnp.asarray(scene.SHAPE_REST)[slot]
    pad = sim.spec.pad_xy[0]
    ee = dynamics.ee_pos(sim)
    holding = sim.held == slot
    done = dynamics.sim_reward(sim)["success"] > 0

    # Not holding: over the object, then down onto its centre, then close.
    xy_off = jnp.linalg.norm(ee[:2] - obj[:2])
    approach = jnp.where(xy_off > XY_TOL, jnp.concatenate([obj[:2], (obj[2] + HOVER)[None]]), obj)
    at_object = jnp.linalg.norm(ee - obj) <= GRASP_TOL
    # A gripper closed on nothing must open before it can close on the object.
    grip_free = jnp.where(at_object & (sim.grip < 0.5), 1.0, -1.0)

    # Holding: up to carrying height, across to the pad, down, open.
    to_pad = pad - obj[:2]
    lifted = obj[2] >= rest + CARRY - 0.02
    over_pad = jnp.linalg.norm(to_pad) <= XY_TOL
    carry_z = ee[2] + (rest + CARRY - obj[2])
    carry = jnp.where(
        over_pad,
        jnp.concatenate([ee[:2] + to_pad, (ee[2] + rest - obj[2])[None]]),
        jnp.concatenate([ee[:2] + jnp.where(lifted, to_pad, 0.0), carry_z[None]]),
    )
    down = over_pad & (obj[2] <= rest + 0.006)
    grip_held = jnp.where(down, -1.0, 1.0)

    # Placed: back up with the gripper open.
    leave = ee + jnp.array([0.0, 0.0, 0.1])

    goal = jnp.where(done, leave, jnp.where(holding, carry, approach))
    grip = jnp.where(done, -1.0, jnp.where(holding, grip_held, grip_free))
    move = jnp.clip((goal - ee) / dynamics.MAX_DELTA, -1.0, 1.0)
    return jnp.concatenate([move, jnp.zeros(3), grip[None]])


def expert_chunk(env, sim: TabletopSim) -> jax.Array:
    """One env's next chunk [K, 7], planned through the env's own sub-steps."""

    def body(s, _):
        a = expert_action(s)
        return dynamics.substep(env.model, s, a), a

    _, actions = jax.lax.scan(body, sim, None, length=env.chunk_length)
    return actions


def expert_actions(env, state: EnvState) -> jax.Array:
    """The expert's chunks for a batched state: [num_envs, K, 7] (jittable)."""
    return jax.vmap(lambda s: expert_chunk(env, s))(state.sim)


def rollout_expert(env, state: EnvState, num_chunks: int) -> tuple[EnvState, dict[str, jax.Array]]:
    """`num_chunks` expert env steps from `state` (jittable): (last state, records).

    Records have axes [num_envs, num_chunks, ...]: ``image``, ``tokens``, ``proprio`` (what
    the policy sees before acting), ``action`` [.., K, 7], ``valid`` (the step was taken
    before the episode ended or succeeded); plus ``success`` [num_envs].
    """

    def body(carry, _):
        state, finished, succeeded = carry
        action = expert_actions(env, state)
        nxt = env.step(state, action)
        rec = {**state.obs, "action": action, "valid": ~finished}
        succeeded = succeeded | (~finished & (nxt.info["success"] > 0))
        finished = finished | (nxt.done > 0) | (nxt.info["success"] > 0)
        return (nxt, finished, succeeded), rec

    no = jnp.zeros(env.num_envs, bool)
    (last, _, success), recs = jax.lax.scan(body, (state, no, no), None, length=num_chunks)
    recs = jax.tree_util.tree_map(lambda x: jnp.swapaxes(x, 0, 1), recs)
    return last, {**recs, "success": success, "episode_id": state.sim.spec.episode_id}


def collect_demos(env, episode_ids, num_chunks: int) -> dict[str, jax.Array]:
    """Expert demonstrations of `episode_ids` ([num_envs]): `rollout_expert`'s records."""
    return rollout_expert(env, env.reset_to(episode_ids), num_chunks)[1]


def demo_dataset(demos: dict, only_success: bool = True) -> dict[str, np.ndarray]:
    """Flatten `collect_demos` output to per-step numpy arrays [N, ...] (valid steps only)."""
    host = jax.device_get(demos)
    keep = np.array(host["valid"], bool)
    if only_success:
        keep &= np.asarray(host["success"], bool)[:, None]
    steps = np.broadcast_to(np.arange(keep.shape[1]), keep.shape)
    ids = np.broadcast_to(np.asarray(host["episode_id"])[:, None], keep.shape)
    out = {k: np.asarray(host[k])[keep] for k in ("image", "tokens", "proprio", "action")}
    out["episode_id"] = ids[keep]
    out["step"] = steps[keep]
    return out
