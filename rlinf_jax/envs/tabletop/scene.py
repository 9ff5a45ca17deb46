"""The tabletop scene: one MuJoCo model shared by every episode, built from a string.

Everything that varies between episodes (which object, its colour, the pads' places, the
table's texture) is data, not model: MJX compiles one program for the whole batch, so the
model holds one body per object *shape*, and an episode picks which bodies are on the
table and which are parked out of sight. Colours are painted per pixel by the renderer from
the geom id a ray hits, which is why every geom here is plain grey.

Bodies only translate (slide joints), so a body's world position is its qpos. The model has
no constraints at all (contacts off, no joint limits): the table holds objects up by a clamp
at their resting height applied after every physics step, and a closed gripper carries an
object by overriding its qpos (see `dynamics.py`). MJX then skips its constraint solver,
which halves the compile time of a step, while gravity, damping and the end effector's
position servos stay MuJoCo's.
"""

from __future__ import annotations

import functools

import mujoco
import numpy as np

# Object shapes, one body each. Half-extents in metres; ``rest`` is the height of the
# centre when the object lies on the table (the lower limit of its z joint).
SHAPES = ("cube", "ball", "capsule", "bar")
SHAPE_GEOMS = {
    "cube": 'type="box" size="0.024 0.024 0.024"',
    "ball": 'type="sphere" size="0.026"',
    # lying on its side: a capsule's axis is its local z, turned onto the world x axis
    "capsule": 'type="capsule" size="0.018 0.026" euler="0 90 0"',
    "bar": 'type="box" size="0.05 0.017 0.017"',
}
SHAPE_REST = np.array([0.024, 0.026, 0.018, 0.017], np.float32)
NUM_SLOTS = len(SHAPES)
NUM_PADS = 2
PAD_HALF = 0.035  # pads are squares of side 7 cm
PAD_HEIGHT = 0.002

TABLE_HALF = (0.36, 0.3)  # x, y half-sizes of the table top (top surface at z = 0)
FLOOR_Z = -0.7
PARK = np.array([3.0, 0.0], np.float32)  # where unused objects wait, far outside the view

# The end effector's reach (a box the commanded position is clipped to).
EE_LOW = np.array([-0.3, -0.26, 0.0], np.float32)
EE_HIGH = np.array([0.3, 0.26, 0.35], np.float32)
EE_RADIUS = 0.018  # visual only: contacts are off

# The fixed camera: position, point looked at, vertical field of view (degrees). Kept as
# plain numbers so a test can project points with its own pinhole model.
CAMERA_POS = np.array([0.0, -0.5, 0.52], np.float32)
CAMERA_LOOKAT = np.array([0.0, 0.02, 0.0], np.float32)
CAMERA_FOVY = 50.0

TIMESTEP = 0.005
FRAMES_PER_SUBSTEP = 8  # one control sub-step = 0.04 s of physics


class Geom:
    """Geom ids in the compiled model (the order of the XML below)."""

    FLOOR = 0
    TABLE = 1
    PAD0 = 2  # pads: PAD0 .. PAD0 + NUM_PADS - 1
    OBJ0 = PAD0 + NUM_PADS  # objects: OBJ0 + slot
    EE = OBJ0 + NUM_SLOTS
    COUNT = EE + 1


def _object_body(i: int, shape: str) -> str:
    return f"""
    <body name="obj_{shape}">
      <joint name="obj_{shape}_x" type="slide" axis="1 0 0" damping="2"/>
      <joint name="obj_{shape}_y" type="slide" axis="0 1 0" damping="2"/>
      <joint name="obj_{shape}_z" type="slide" axis="0 0 1" damping="2"/>
      <geom name="obj_{shape}" {SHAPE_GEOMS[shape]} mass="0.1" material="plain"/>
    </body>"""


def scene_xml() -> str:
    objects = "".join(_object_body(i, s) for i, s in enumerate(SHAPES))
    pads = "".join(
        f"""
    <body name="pad{j}" mocap="true" pos="0 0 {PAD_HEIGHT / 2:.4f}">
      <geom name="pad{j}" type="box" size="{PAD_HALF} {PAD_HALF} {PAD_HEIGHT / 2:.4f}" material="plain"/>
    </body>"""
        for j in range(NUM_PADS)
    )
    tx, ty = TABLE_HALF
    return f"""
<mujoco model="rlinf_tabletop">
  <option timestep="{TIMESTEP}" integrator="implicitfast">
    <flag contact="disable"/>
  </option>
  <asset>
    <!-- mjx.ray reads colours through the material table, which must not be empty -->
    <material name="plain" rgba="0.5 0.5 0.5 1"/>
  </asset>
  <worldbody>
    <geom name="floor" type="plane" pos="0 0 {FLOOR_Z}" size="2 2 0.1" material="plain"/>
    <geom name="table" type="box" pos="0 0 -0.02" size="{tx} {ty} 0.02" material="plain"/>{pads}{objects}
    <body name="ee" gravcomp="1">
      <joint name="ee_x" type="slide" axis="1 0 0"/>
      <joint name="ee_y" type="slide" axis="0 1 0"/>
      <joint name="ee_z" type="slide" axis="0 0 1"/>
      <geom name="ee" type="sphere" size="{EE_RADIUS}" mass="0.2" material="plain"/>
    </body>
  </worldbody>
  <actuator>
    <!-- critically damped servos: kv = 2 sqrt(kp m), time constant 10 ms -->
    <position name="ee_x" joint="ee_x" kp="2000" kv="40" ctrlrange="-1 1"/>
    <position name="ee_y" joint="ee_y" kp="2000" kv="40" ctrlrange="-1 1"/>
    <position name="ee_z" joint="ee_z" kp="2000" kv="40" ctrlrange="-1 1"/>
  </actuator>
</mujoco>
"""


@functools.lru_cache(maxsize=1)
def mj_model() -> mujoco.MjModel:
    model = mujoco.MjModel.from_xml_string(scene_xml())
    names = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_GEOM, g) for g in range(model.ngeom)]
    expected = ["floor", "table"] + [f"pad{j}" for j in range(NUM_PADS)] + [f"obj_{s}" for s in SHAPES] + ["ee"]
    assert names == expected, names  # Geom ids above depend on this order
    return model


@functools.lru_cache(maxsize=1)
def static_geom_frames() -> tuple[np.ndarray, np.ndarray]:
    """(world positions of the world geoms [2, 3], every geom's rotation [ngeom, 3, 3]).

    Bodies only translate, so geom rotations never change and the renderer can place geoms
    from qpos and the pads' mocap positions without running MJX kinematics.
    """
    model = mj_model()
    data = mujoco.MjData(model)
    mujoco.mj_kinematics(model, data)
    world = data.geom_xpos[[Geom.FLOOR, Geom.TABLE]].astype(np.float32)
    return world, data.geom_xmat.reshape(-1, 3, 3).astype(np.float32)


# qpos layout: each object slot has (x, y, z), then the end effector's (x, y, z).
def obj_qpos_index(slot: int) -> slice:
    return slice(3 * slot, 3 * slot + 3)


EE_QPOS = slice(3 * NUM_SLOTS, 3 * NUM_SLOTS + 3)
NQ = 3 * NUM_SLOTS + 3


def camera_frame() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(right, up, forward) unit vectors of the camera in world coordinates."""
    forward = CAMERA_LOOKAT - CAMERA_POS
    forward = forward / np.linalg.norm(forward)
    right = np.cross(forward, np.array([0.0, 0.0, 1.0]))
    right = right / np.linalg.norm(right)
    up = np.cross(right, forward)
    return right.astype(np.float32), up.astype(np.float32), forward.astype(np.float32)


def camera_rays(size: int) -> np.ndarray:
    """Unit ray directions [size, size, 3] through pixel centres (row 0 is the top)."""
    right, up, forward = camera_frame()
    half = np.tan(np.deg2rad(CAMERA_FOVY) / 2)
    # pixel centre offsets in [-1, 1] on the image plane at unit distance
    c = (np.arange(size, dtype=np.float32) + 0.5) / size * 2 - 1
    u = c[None, :] * half  # columns: left to right
    v = -c[:, None] * half  # rows: top to bottom
    rays = forward + u[..., None] * right + v[..., None] * up
    return (rays / np.linalg.norm(rays, axis=-1, keepdims=True)).astype(np.float32)
