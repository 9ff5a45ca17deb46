"""One env, no batch axis: the state, one control sub-step, the shaped reward.

A sub-step turns a 7-D end-effector-delta action into a servo target, runs
`scene.FRAMES_PER_SUBSTEP` MJX steps, then applies the gripper. Grasping is a weld made in
JAX: closing the gripper within `GRASP_RADIUS` of an object's centre attaches the nearest
object at its current offset, which then follows the end effector (its qpos overridden,
its velocity zeroed) until the gripper opens and gravity takes it back to the table. The
rotation dims of the action are accepted and ignored: the end effector is a point.

The MJX `Data` is not kept between sub-steps: the state holds qpos/qvel and a fresh `Data`
is made from them, which keeps the state small (rollout buffers, auto-reset copies) and the
same for every env.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct
from mujoco import mjx

from rlinf_jax.envs.tabletop import catalog, scene
from rlinf_jax.envs.tabletop.episodes import EpisodeSpec

ACTION_SIZE = 7  # dx, dy, dz, droll, dpitch, dyaw, gripper (> 0 closes)
MAX_DELTA = 0.03  # metres per sub-step at |action| = 1
GRASP_RADIUS = 0.03
LIFT_HEIGHT = 0.05  # lift term saturates this far above the resting height
REST_TOL = 0.01  # an object this close to its resting height lies on the table
REWARD_SCALE = 10.0  # 1/m inside the tanh of the distance terms
# Weights of the shaped terms. Holding the object over the target earns at most 0.8, an
# object dropped over the pad 0.8 + 0.15 * reach < 1, and success always 1: every stage
# pays more than the one before, and hovering never beats putting the object down.
REWARD_WEIGHTS = {"reach": 0.15, "grasp": 0.25, "lift": 0.15, "carry": 0.25, "place": 0.8}


@struct.dataclass
class TabletopSim:
    qpos: jax.Array  # [scene.NQ]: object slots (x, y, z) each, then the end effector
    qvel: jax.Array  # [scene.NQ]
    grip: jax.Array  # float32: 1 closed, 0 open
    held: jax.Array  # int32: object slot attached to the gripper, -1 for none
    offset: jax.Array  # [3]: held object's centre minus the end effector
    t: jax.Array  # int32: sub-steps since reset
    spec: EpisodeSpec


def obj_slot(spec: EpisodeSpec) -> jax.Array:
    return jnp.asarray(catalog.OBJECT_SLOT)[spec.obj]


def active_slots(spec: EpisodeSpec) -> jax.Array:
    """bool [NUM_SLOTS]: the slots on the table (the task object and any distractor)."""
    slot = jnp.asarray(catalog.OBJECT_SLOT)
    idx = jnp.arange(scene.NUM_SLOTS)
    dslot = jnp.where(spec.distractor >= 0, slot[jnp.maximum(spec.distractor, 0)], -1)
    return (idx == slot[spec.obj]) | (idx == dslot)


def initial_sim(spec: EpisodeSpec) -> TabletopSim:
    rest = jnp.asarray(scene.SHAPE_REST)
    objs = jnp.concatenate([jnp.broadcast_to(jnp.asarray(scene.PARK), (scene.NUM_SLOTS, 2)), rest[:, None]], axis=1)
    slot = jnp.asarray(catalog.OBJECT_SLOT)
    objs = objs.at[slot[spec.obj], :2].set(spec.obj_xy)
    has_d = spec.distractor >= 0
    dslot = slot[jnp.maximum(spec.distractor, 0)]
    objs = jnp.where(has_d, objs.at[dslot, :2].set(spec.distractor_xy), objs)
    qpos = jnp.concatenate([objs.reshape(-1), spec.ee_init]).astype(jnp.float32)
    return TabletopSim(
        qpos=qpos,
        qvel=jnp.zeros_like(qpos),
        grip=jnp.zeros((), jnp.float32),
        held=jnp.full((), -1, jnp.int32),
        offset=jnp.zeros(3, jnp.float32),
        t=jnp.zeros((), jnp.int32),
        spec=spec,
    )


def objects(sim: TabletopSim) -> jax.Array:
    """Object slot centres [NUM_SLOTS, 3]."""
    return sim.qpos[: 3 * scene.NUM_SLOTS].reshape(scene.NUM_SLOTS, 3)


def ee_pos(sim: TabletopSim) -> jax.Array:
    return sim.qpos[scene.EE_QPOS]


def mjx_data(m: mjx.Model, sim: TabletopSim, ctrl: jax.Array | None = None) -> mjx.Data:
    pads = jnp.concatenate([sim.spec.pad_xy, jnp.full((scene.NUM_PADS, 1), scene.PAD_HEIGHT / 2)], axis=1)
    d = mjx.make_data(m).replace(qpos=sim.qpos, qvel=sim.qvel, mocap_pos=pads)
    return d if ctrl is None else d.replace(ctrl=ctrl)


def geom_poses(m: mjx.Model, sim: TabletopSim) -> mjx.Data:
    """A `Data` holding just what the renderer reads: every geom's world pose.

    Geoms sit at their bodies' origins and bodies only translate (pads are mocap bodies),
    so positions come straight from qpos and rotations are constants; cheaper to compile
    than `mjx.kinematics`, which the tests check against.
    """
    world, xmat = scene.static_geom_frames()
    pads = jnp.concatenate([sim.spec.pad_xy, jnp.full((scene.NUM_PADS, 1), scene.PAD_HEIGHT / 2)], axis=1)
    xpos = jnp.concatenate([jnp.asarray(world), pads, objects(sim), ee_pos(sim)[None]], axis=0)
    return mjx.make_data(m).replace(geom_xpos=xpos, geom_xmat=jnp.asarray(xmat))


def _set_slot(qpos: jax.Array, qvel: jax.Array, slot: jax.Array, pos: jax.Array, on: jax.Array):
    """Where `on`, put object `slot` at `pos` at rest."""
    idx = 3 * slot + jnp.arange(3)
    qpos = jnp.where(on, qpos.at[idx].set(pos), qpos)
    qvel = jnp.where(on, qvel.at[idx].set(0.0), qvel)
    return qpos, qvel


def substep(m: mjx.Model, sim: TabletopSim, action: jax.Array) -> TabletopSim:
    """One control sub-step of one env; `action` is [7]."""
    action = jnp.clip(jnp.asarray(action, jnp.float32), -1.0, 1.0)
    target = jnp.clip(ee_pos(sim) + action[:3] * MAX_DELTA, scene.EE_LOW, scene.EE_HIGH)

    rest = jnp.asarray(scene.SHAPE_REST)
    z = 3 * jnp.arange(scene.NUM_SLOTS) + 2

    def frame(d, _):
        d = mjx.step(m, d)
        # The table: an object below its resting height is put back on it, stopped.
        below = d.qpos[z] < rest
        qpos = d.qpos.at[z].set(jnp.maximum(d.qpos[z], rest))
        qvel = d.qvel.at[z].set(jnp.where(below, jnp.maximum(d.qvel[z], 0.0), d.qvel[z]))
        return d.replace(qpos=qpos, qvel=qvel), None

    d, _ = jax.lax.scan(frame, mjx_data(m, sim, target), None, length=scene.FRAMES_PER_SUBSTEP)
    qpos, qvel = d.qpos, d.qvel
    ee = qpos[scene.EE_QPOS]

    close = action[6] > 0
    was_closed = sim.grip > 0.5
    closing = close & ~was_closed
    centres = qpos[: 3 * scene.NUM_SLOTS].reshape(scene.NUM_SLOTS, 3)
    dist = jnp.linalg.norm(centres - ee, axis=-1)
    dist = jnp.where(active_slots(sim.spec), dist, jnp.inf)
    nearest = jnp.argmin(dist).astype(jnp.int32)
    grab = closing & (dist[nearest] <= GRASP_RADIUS)
    held = jnp.where(grab, nearest, jnp.where(close, sim.held, -1))
    offset = jnp.where(grab, centres[nearest] - ee, sim.offset)

    # The weld: a held object follows the gripper but never sinks into the table.
    carried = ee + offset
    carried = carried.at[2].set(jnp.maximum(carried[2], rest[jnp.maximum(held, 0)]))
    qpos, qvel = _set_slot(qpos, qvel, jnp.maximum(held, 0), carried, held >= 0)
    # A released object starts falling from rest, not with the gripper's speed.
    released = (sim.held >= 0) & (held < 0)
    rslot = jnp.maximum(sim.held, 0)
    qvel = jnp.where(released, qvel.at[3 * rslot + jnp.arange(3)].set(0.0), qvel)

    t = sim.t + 1
    # Execution split: the object jumps to another cell unless it is already in the gripper.
    slot = obj_slot(sim.spec)
    jump = (t == sim.spec.move_step) & (held != slot)
    pos = jnp.concatenate([sim.spec.move_xy, jnp.asarray(scene.SHAPE_REST)[slot][None]])
    qpos, qvel = _set_slot(qpos, qvel, slot, pos, jump)

    return sim.replace(qpos=qpos, qvel=qvel, grip=close.astype(jnp.float32), held=held, offset=offset, t=t)


def reward_terms(ee, obj, rest, pad_xy, grasped) -> dict[str, jax.Array]:
    """Shaped reward terms and the reward from positions (pure math, any batch shape).

    ee, obj: [..., 3]; rest: [...] resting height of the object's centre; pad_xy: [..., 2];
    grasped: [...] 1 where the gripper holds the task object.
    """
    grasped = jnp.asarray(grasped, jnp.float32)
    reach = 1.0 - jnp.tanh(REWARD_SCALE * jnp.linalg.norm(ee - obj, axis=-1))
    lift = grasped * jnp.clip((obj[..., 2] - rest) / LIFT_HEIGHT, 0.0, 1.0)
    carry = grasped * (1.0 - jnp.tanh(REWARD_SCALE * jnp.linalg.norm(obj[..., :2] - pad_xy, axis=-1)))
    over_pad = jnp.all(jnp.abs(obj[..., :2] - pad_xy) <= scene.PAD_HALF, axis=-1).astype(jnp.float32)
    place = (1.0 - grasped) * over_pad
    success = place * (obj[..., 2] <= rest + REST_TOL).astype(jnp.float32)
    terms = {"reach": reach, "grasp": grasped, "lift": lift, "carry": carry, "place": place}
    shaped = sum(REWARD_WEIGHTS[k] * v for k, v in terms.items())
    return {**terms, "success": success, "reward": jnp.where(success > 0, 1.0, shaped)}


def sim_reward(sim: TabletopSim) -> dict[str, jax.Array]:
    slot = obj_slot(sim.spec)
    return reward_terms(
        ee_pos(sim),
        objects(sim)[slot],
        jnp.asarray(scene.SHAPE_REST)[slot],
        sim.spec.pad_xy[0],
        (sim.held == slot).astype(jnp.float32),
    )


def proprio(sim: TabletopSim) -> jax.Array:
    """[4]: end-effector position and gripper state."""
    return jnp.concatenate([ee_pos(sim), sim.grip[None]])
