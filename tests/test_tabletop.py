"""The tabletop VLA benchmark: episode ids and splits, rendering against a hand pinhole
projection, chunked steps against single steps, reward terms against hand formulas, the
scripted expert, batching against per-env calls, and the registry entry."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlinf_jax.config.schema import EnvConfig
from rlinf_jax.envs import make_env
from rlinf_jax.envs.tabletop import (
    SPLITS,
    TabletopEnv,
    catalog,
    decode_tokens,
    describe,
    dynamics,
    episode_id,
    episode_spec,
    episodes,
    expert,
    instruction,
    reward_terms,
    scene,
    split_of,
)
from rlinf_jax.errors import BadInput

N_PER_SPLIT = 256


class Stepper:
    """An env with its jitted reset and step, shared so that tests compile them once."""

    def __init__(self, **config):
        self.env = TabletopEnv(**config)
        self.reset_to = jax.jit(self.env.reset_to)
        self.step = jax.jit(self.env.step)


def _specs(split: str):
    return jax.device_get(episode_spec(split, np.arange(N_PER_SPLIT)))


@pytest.fixture(scope="module")
def specs():
    return {s: _specs(s) for s in SPLITS}


# ---- episode ids and splits ----


def test_episode_ids_are_deterministic_and_ranges_disjoint(specs):
    again = _specs("execution")
    for a, b in zip(jax.tree_util.tree_leaves(specs["execution"]), jax.tree_util.tree_leaves(again)):
        np.testing.assert_array_equal(a, b)
    ranges = [set(episode_id(s, np.arange(1000)).tolist()) for s in SPLITS]
    for i in range(len(SPLITS)):
        for j in range(i + 1, len(SPLITS)):
            assert not ranges[i] & ranges[j]
    eid = episode_id("semantic", 12345)
    assert split_of(eid) == ("semantic", 12345)
    assert describe(eid) == describe(eid)
    for bad in (lambda: episode_id("nope", 0), lambda: episode_id("train", -1), lambda: split_of(-3)):
        with pytest.raises(BadInput):
            bad()


def _inside_train_region(xy):
    return (np.abs(xy[..., 0]) <= episodes.TRAIN_REGION[0]) & (np.abs(xy[..., 1]) <= episodes.TRAIN_REGION[1])


def _factors(s) -> dict[str, np.ndarray]:
    """Per-episode booleans: does each factor lie in the training distribution?"""
    ee_off = np.abs(s.ee_init - episodes.EE_HOME)
    return {
        "object": s.obj < catalog.NUM_TRAIN_OBJECTS,
        "template": s.template < catalog.NUM_TRAIN_TEMPLATES,
        "no_distractor": s.distractor < 0,
        "texture": s.texture < catalog.NUM_TRAIN_TEXTURES,
        "background": s.background < catalog.NUM_TRAIN_BACKGROUNDS,
        "positions": _inside_train_region(s.obj_xy) & _inside_train_region(s.pad_xy).all(-1),
        "pose": (ee_off <= episodes.EE_JITTER + 1e-6).all(-1),
        "no_move": s.move_step < 0,
    }


CLAIMS = {
    "train": set(),
    "vision": {"texture", "background"},
    "semantic": {"object", "template", "no_distractor"},
    "execution": {"positions", "pose", "no_move"},
}


@pytest.mark.parametrize("split", SPLITS)
def test_each_split_differs_from_train_in_exactly_its_factors(specs, split):
    factors = _factors(specs[split])
    for name, in_train in factors.items():
        if name in CLAIMS[split]:
            assert not in_train.any(), f"{split}: some episode has a training {name}"
        else:
            assert in_train.all(), f"{split}: {name} left the training distribution"
    # The training split itself covers its supports (not one constant episode).
    if split == "train":
        s = specs[split]
        assert len(set(s.obj.tolist())) == catalog.NUM_TRAIN_OBJECTS
        assert len(set(s.template.tolist())) == catalog.NUM_TRAIN_TEMPLATES
        assert len(set(s.texture.tolist())) == catalog.NUM_TRAIN_TEXTURES


def test_split_details(specs):
    sem = specs["semantic"]
    slot = catalog.OBJECT_SLOT
    assert (slot[sem.distractor] != slot[sem.obj]).all()  # a distractor has a body of its own
    ex = specs["execution"]
    # every object and target starts outside the training region, the pose is perturbed by
    # at least 5 cm per axis and the object jumps within the configured sub-steps
    assert not _inside_train_region(ex.obj_xy).any() and not _inside_train_region(ex.pad_xy[:, 0]).any()
    assert (np.abs(ex.ee_init - episodes.EE_HOME) >= episodes.EE_PERTURB[0] - 1e-6).all()
    assert ((ex.move_step >= episodes.MOVE_STEPS[0]) & (ex.move_step <= episodes.MOVE_STEPS[1])).all()
    # object, pads and distractor never share a spot: the object never starts on a pad
    for s in specs.values():
        pts = np.stack([s.obj_xy, s.pad_xy[:, 0], s.pad_xy[:, 1], s.distractor_xy], 1)
        gaps = np.linalg.norm(pts[:, :, None] - pts[:, None], axis=-1) + np.eye(4) * 9
        assert gaps.min() > scene.PAD_HALF + 0.02
        assert (s.target != s.other_pad).all()


def test_instruction_tokens_round_trip(specs):
    s = specs["semantic"]
    for i in range(5):
        eid = int(s.episode_id[i])
        text = instruction(eid)
        obj, target = catalog.OBJECT_NAMES[s.obj[i]], catalog.PAD_NAMES[s.target[i]]
        assert obj in text and target in text
        assert decode_tokens(s.tokens[i]) == text
        assert text == describe(eid)["instruction"]


# ---- rendering ----


def _project(points: np.ndarray, size: int) -> np.ndarray:
    """Hand pinhole projection of world points [N, 3] -> (row, col) [N, 2] pixel coords."""
    pos, look = scene.CAMERA_POS.astype(np.float64), scene.CAMERA_LOOKAT.astype(np.float64)
    f = (look - pos) / np.linalg.norm(look - pos)
    r = np.cross(f, [0.0, 0.0, 1.0])
    r /= np.linalg.norm(r)
    u = np.cross(r, f)
    rel = points - pos
    xc, yc, zc = rel @ r, rel @ u, rel @ f
    focal = (size / 2) / math.tan(math.radians(scene.CAMERA_FOVY) / 2)  # pixels
    col = size / 2 + focal * xc / zc
    row = size / 2 - focal * yc / zc
    return np.stack([row, col], -1)


@pytest.fixture(scope="module")
def render_env():
    return Stepper(num_envs=8, image_size=32)


def test_render_paints_object_pad_and_gripper_where_they_project(render_env):
    ids = episode_id("semantic", np.arange(8))  # with distractors: several objects on the table
    state = render_env.reset_to(jnp.asarray(ids))
    img = np.asarray(state.obs["image"])
    assert img.shape == (8, 32, 32, 3) and img.dtype == np.uint8
    # Park the gripper in the near right corner, closed, so it hides nothing we look at.
    ee = np.array([0.22, -0.2, 0.1], np.float32)
    sim = state.sim.replace(qpos=state.sim.qpos.at[:, scene.EE_QPOS].set(ee), grip=jnp.ones(8))
    moved = np.asarray(jax.jit(jax.vmap(render_env.env.observe))(sim)["image"])
    spec = jax.device_get(state.sim.spec)
    to_u8 = lambda rgb: np.round(np.asarray(rgb) * 255).astype(np.uint8)
    for b in range(8):
        obj = np.array([*spec.obj_xy[b], scene.SHAPE_REST[catalog.OBJECT_SLOT[spec.obj[b]]]])
        dis = np.array([*spec.distractor_xy[b], scene.SHAPE_REST[catalog.OBJECT_SLOT[spec.distractor[b]]]])
        pad = np.array([*spec.pad_xy[b, 0], scene.PAD_HEIGHT])
        rc = _project(np.stack([obj, dis, pad, ee]), 32).astype(int)
        assert all(np.abs(rc[3] - rc[k]).max() >= 2 for k in range(3))
        np.testing.assert_array_equal(moved[b, rc[0, 0], rc[0, 1]], to_u8(catalog.OBJECT_RGB[spec.obj[b]]))
        np.testing.assert_array_equal(moved[b, rc[1, 0], rc[1, 1]], to_u8(catalog.OBJECT_RGB[spec.distractor[b]]))
        np.testing.assert_array_equal(moved[b, rc[2, 0], rc[2, 1]], to_u8(catalog.PAD_RGB[spec.target[b]]))
        np.testing.assert_array_equal(moved[b, rc[3, 0], rc[3, 1]], to_u8(catalog.EE_CLOSED_RGB))
        # the top row looks past the table and the floor: the wall of the episode's background
        np.testing.assert_array_equal(moved[b, 0, 16], to_u8(catalog.WALL_RGB[spec.background[b]]))
        # moving the gripper changed only pixels near where it was and where it went
        changed = np.argwhere((moved[b] != img[b]).any(-1))
        was = _project(spec.ee_init[b][None], 32)[0]
        near = np.minimum(np.abs(changed - was).max(-1), np.abs(changed - rc[3]).max(-1))
        assert len(changed) and near.max() <= 2


def test_geom_poses_match_mjx_kinematics(render_env):
    """The renderer places geoms from qpos; MJX's own kinematics must agree."""
    from mujoco import mjx

    ids = jnp.asarray(episode_id("semantic", np.arange(8)))
    sim = render_env.reset_to(ids).sim
    sim = sim.replace(qpos=sim.qpos + 0.01 * jnp.arange(scene.NQ))  # off the initial layout
    m = render_env.env.model
    ours = jax.jit(jax.vmap(lambda s: dynamics.geom_poses(m, s)))(sim)
    theirs = jax.jit(jax.vmap(lambda s: mjx.kinematics(m, dynamics.mjx_data(m, s))))(sim)
    np.testing.assert_allclose(ours.geom_xpos, theirs.geom_xpos, atol=1e-6)
    np.testing.assert_allclose(ours.geom_xmat, theirs.geom_xmat, atol=1e-6)


# ---- reward ----


def _hand_reward(ee, obj, rest, pad, grasped):
    reach = 1 - math.tanh(10 * math.dist(ee, obj))
    lift = grasped * min(max((obj[2] - rest) / 0.05, 0.0), 1.0)
    carry = grasped * (1 - math.tanh(10 * math.dist(obj[:2], pad)))
    over = abs(obj[0] - pad[0]) <= 0.035 and abs(obj[1] - pad[1]) <= 0.035
    place = (1 - grasped) * over
    success = place * (obj[2] <= rest + 0.01)
    shaped = 0.15 * reach + 0.25 * grasped + 0.15 * lift + 0.25 * carry + 0.8 * place
    return {
        "reach": reach,
        "grasp": grasped,
        "lift": lift,
        "carry": carry,
        "place": place,
        "success": success,
        "reward": 1.0 if success else shaped,
    }


HAND_STATES = [
    # ee, object centre, resting height, target pad xy, grasped
    ((0.0, -0.15, 0.2), (0.1, 0.05, 0.024), 0.024, (-0.1, 0.0), 0.0),  # start: far from all
    ((0.1, 0.05, 0.03), (0.1, 0.05, 0.024), 0.024, (-0.1, 0.0), 0.0),  # at the object
    ((0.0, 0.02, 0.06), (0.0, 0.02, 0.05), 0.024, (-0.1, 0.0), 1.0),  # lifted, on the way
    ((-0.09, 0.01, 0.2), (-0.09, 0.01, 0.19), 0.024, (-0.1, 0.0), 1.0),  # high over the pad
    ((-0.09, 0.01, 0.1), (-0.09, 0.01, 0.09), 0.026, (-0.1, 0.0), 0.0),  # dropped, falling
    ((-0.09, 0.01, 0.1), (-0.09, 0.01, 0.027), 0.026, (-0.1, 0.0), 0.0),  # placed: success
    ((-0.05, 0.01, 0.1), (-0.05, 0.01, 0.017), 0.017, (-0.1, 0.0), 0.0),  # beside the pad
]


def test_reward_terms_match_hand_formula():
    for ee, obj, rest, pad, grasped in HAND_STATES:
        got = reward_terms(jnp.array(ee), jnp.array(obj), jnp.array(rest), jnp.array(pad), jnp.array(grasped))
        want = _hand_reward(ee, obj, rest, pad, grasped)
        for k, v in want.items():
            assert float(got[k]) == pytest.approx(v, abs=1e-5), (k, ee, obj)
    # stages pay in order: holding over the pad < dropped over it < placed
    r = [_hand_reward(*s)["reward"] for s in HAND_STATES]
    assert r[0] < r[1] < r[2] < r[3] < r[4] < r[5] == 1.0


# ---- stepping ----


@pytest.fixture(scope="module")
def env1():
    return Stepper(num_envs=2, image_size=8, chunk_length=1, max_steps=6)


@pytest.mark.slow
def test_chunked_step_equals_single_steps_and_stops_at_done(env1):
    env4 = Stepper(num_envs=2, image_size=8, chunk_length=4, max_steps=6)
    ids = jnp.asarray(episode_id("execution", np.array([3, 4])))  # the object jumps at step 6..14
    actions = jax.random.uniform(jax.random.PRNGKey(3), (2, 8, 7), minval=-1, maxval=1)
    actions = actions.at[:, :, 6].set(jnp.where(jnp.arange(8) % 3 == 2, 1.0, -1.0))  # some closes
    step1, step4 = env1.step, env4.step

    s1 = env1.reset_to(ids)
    singles = []
    for k in range(8):
        s1 = step1(s1, actions[:, k])
        singles.append(s1)
        if k == 5:
            s1_at_done = s1
    s4 = env4.reset_to(ids)
    first = step4(s4, actions[:, :4])
    second = step4(first, actions[:, 4:])

    np.testing.assert_allclose(first.reward, sum(s.reward for s in singles[:4]), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(first.sim.qpos, singles[3].sim.qpos, atol=1e-6)
    np.testing.assert_array_equal(first.obs["image"], singles[3].obs["image"])
    np.testing.assert_array_equal(first.done, 0.0)
    # the episode ends at sub-step 6, inside the second chunk: sub-steps 7-8 are discarded
    np.testing.assert_allclose(second.reward, singles[4].reward + singles[5].reward, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(second.sim.qpos, s1_at_done.sim.qpos, atol=1e-6)
    np.testing.assert_array_equal(second.sim.t, 6)
    np.testing.assert_array_equal(second.done, 1.0)
    np.testing.assert_array_equal(second.truncated, 1.0)
    np.testing.assert_array_equal(second.obs["proprio"], s1_at_done.obs["proprio"])


@pytest.mark.slow
def test_batched_step_equals_per_env_steps_and_hand_reward(env1):
    """vmap inside the env against each env alone; the env's reward against the hand formula."""
    ids = jnp.asarray(episode_id("train", np.array([7, 8])))
    state = env1.reset_to(ids)
    # A hand state: env 0 holds its object 15 cm over the target pad.
    sim = state.sim
    slot0 = int(catalog.OBJECT_SLOT[int(sim.spec.obj[0])])
    pad0 = np.asarray(sim.spec.pad_xy[0, 0])
    ee = np.array([pad0[0] + 0.01, pad0[1], 0.17], np.float32)
    qpos = sim.qpos.at[0, scene.EE_QPOS].set(ee).at[0, 3 * slot0 : 3 * slot0 + 3].set(ee - [0, 0, 0.01])
    sim = sim.replace(
        qpos=qpos,
        grip=sim.grip.at[0].set(1.0),
        held=sim.held.at[0].set(slot0),
        offset=sim.offset.at[0].set(jnp.array([0.0, 0.0, -0.01])),
    )
    state = state.replace(sim=sim)
    actions = jnp.array([[0.0, 0.0, 0.0, 0.3, -0.2, 0.1, 1.0], [1.0, -0.5, -1.0, 0.0, 0.0, 0.0, 1.0]])
    batched = env1.step(state, actions)
    one = jax.jit(env1.env.step_one)
    for b in range(2):
        row = jax.tree_util.tree_map(lambda x, b=b: x[b], state)
        alone = one(row, actions[b][None])
        for x, y in zip(
            jax.tree_util.tree_leaves(alone),
            jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda x, b=b: x[b], batched)),
        ):
            np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), atol=1e-6)
    # env 0 keeps holding (gripper closed, zero delta): reward from the hand formula
    q = np.asarray(batched.sim.qpos[0], np.float64)
    got_ee, got_obj = q[scene.EE_QPOS], q[3 * slot0 : 3 * slot0 + 3]
    assert np.abs(got_ee - ee).max() < 2e-3  # the servo holds still
    want = _hand_reward(tuple(got_ee), tuple(got_obj), float(scene.SHAPE_REST[slot0]), tuple(pad0), 1.0)
    assert float(batched.reward[0]) == pytest.approx(want["reward"], abs=1e-5)
    assert float(batched.obs["proprio"][0, 3]) == 1.0


def test_bad_actions_and_configs_are_rejected(env1):
    state = env1.reset_to(jnp.asarray(episode_id("train", np.array([0, 1]))))
    with pytest.raises(BadInput, match="chunk_length"):
        env1.step(state, jnp.zeros((2, 3, 7)))
    with pytest.raises(BadInput, match="episode ids"):
        env1.reset_to(jnp.zeros(3, jnp.int32))
    with pytest.raises(BadInput, match="group_size"):
        TabletopEnv(num_envs=6, group_size=4)
    with pytest.raises(BadInput, match="split"):
        TabletopEnv(split="visual")
    grouped = TabletopEnv(num_envs=6, group_size=3, image_size=8)
    ids = np.asarray(grouped.sample_episode_ids(jax.random.PRNGKey(0)))
    assert (ids[:3] == ids[0]).all() and (ids[3:] == ids[3]).all() and ids[0] != ids[3]
    assert all(split_of(i)[0] == "train" for i in ids)


# ---- expert ----


@pytest.mark.slow
def test_scripted_expert_solves_training_episodes_and_records_demos():
    n = 16
    env = TabletopEnv(num_envs=n, image_size=8, chunk_length=8, max_steps=80)
    ids = jnp.asarray(episode_id("train", np.arange(100, 100 + n)))
    run = jax.jit(lambda i: expert.rollout_expert(env, env.reset_to(i), 10))
    last, demos = jax.device_get(run(ids))
    # Success judged from where the object lies at the end, by hand from qpos.
    sim = last.sim
    slots = catalog.OBJECT_SLOT[sim.spec.obj]
    obj = sim.qpos[np.arange(n)[:, None], 3 * slots[:, None] + np.arange(3)]
    on_pad = (np.abs(obj[:, :2] - sim.spec.pad_xy[:, 0]) <= scene.PAD_HALF).all(-1)
    resting = obj[:, 2] <= scene.SHAPE_REST[slots] + 0.01
    placed = on_pad & resting & (sim.held != slots)
    assert placed.mean() >= 0.9
    np.testing.assert_array_equal(placed, demos["success"])
    ds = expert.demo_dataset(demos)
    steps = int(demos["valid"][demos["success"]].sum())
    assert ds["image"].shape == (steps, 8, 8, 3) and ds["action"].shape == (steps, 8, 7)
    assert ds["tokens"].shape == (steps, 16) and ds["proprio"].shape == (steps, 4)
    assert (np.abs(ds["action"]) <= 1).all() and (ds["action"][..., 3:6] == 0).all()
    # a demo's first step shows the episode's start: the gripper where the episode put it
    first = ds["step"] == 0
    assert first.sum() == placed.sum()
    want = np.asarray(episode_spec("train", np.arange(100, 100 + n)).ee_init)[ds["episode_id"][first] - 100]
    np.testing.assert_allclose(ds["proprio"][first, :3], want, atol=1e-6)


# ---- layouts ----


def test_task_layout_fixes_cells_per_task_and_keeps_the_splits_apart(specs):
    task = {s: jax.device_get(episode_spec(s, np.arange(N_PER_SPLIT), layout="task")) for s in SPLITS}
    for s in SPLITS:  # only positions (and the other pad) may change with the layout
        for name in ("obj", "target", "texture", "background", "template", "distractor", "ee_init", "move_step"):
            np.testing.assert_array_equal(getattr(task[s], name), getattr(specs[s], name))

    def cells(spec):  # the grid cell of the object, target pad and other pad (jitter < half a cell)
        return np.round(np.concatenate([spec.obj_xy, spec.pad_xy[:, 0], spec.pad_xy[:, 1]], 1) / 0.05).astype(int)

    for s in ("train", "vision"):
        t, c = task[s], cells(task[s])
        keys = t.obj * len(catalog.PADS) + t.target
        seen = {}
        for k, row, other in zip(keys, c, t.other_pad):
            seen.setdefault(int(k), set()).add((tuple(row), int(other)))
        repeated = [v for v in seen.values()]
        assert all(len(v) == 1 for v in repeated), "one layout per task"
        assert sum(1 for k in keys if (keys == k).sum() > 1) > 100  # many tasks do repeat
        assert (t.other_pad != t.target).all()
        # ... while the random layout draws a new one per episode for the same tasks
        r = cells(specs[s])
        varied = [len({tuple(row) for row in r[keys == k]}) > 1 for k in np.unique(keys) if (keys == k).sum() > 2]
        assert np.mean(varied) > 0.9
        # the same (task, layout) pairs in train and vision: vision changes only the look
        assert np.all(np.abs(t.obj_xy) <= np.array(episodes.TRAIN_REGION) + 1e-6)
    vis = task["vision"]
    train_layout = {int(k): tuple(row) for k, row in zip(task["train"].obj * 4 + task["train"].target, cells(task["train"]))}
    for k, row in zip(vis.obj * 4 + vis.target, cells(vis)):
        if int(k) in train_layout:
            assert train_layout[int(k)] == tuple(row)
    ex = task["execution"]  # positions outside the training region, drawn per episode still
    assert (np.abs(ex.obj_xy) > np.array(episodes.TRAIN_REGION)).any(1).all()
    np.testing.assert_array_equal(ex.obj_xy, specs["execution"].obj_xy)
    with pytest.raises(BadInput, match="layout"):
        TabletopEnv(layout="fixed")
    with pytest.raises(BadInput, match="layout"):
        describe(episode_id("train", 0), layout="grid")


# ---- registry ----


def test_registry_builds_the_tabletop_stack():
    cfg = EnvConfig(suite="tabletop", name="vision", backend="mjx", num_envs=2, num_eval_envs=2, episode_length=10)
    env = make_env(cfg)
    state = jax.jit(env.reset)(jax.random.PRNGKey(0))
    assert state.obs["image"].shape == (2, 32, 32, 3)
    assert {"final_obs", "episode_success", "success", "eid"} <= set(state.info)
    assert all(split_of(int(i))[0] == "vision" for i in state.info["eid"])
    for bad in ({"name": "visual"}, {"action_repeat": 2}, {"backend": "positional"}, {"layout": "grid"}):
        with pytest.raises(BadInput):
            make_env(EnvConfig(**{**cfg.__dict__, **bad}))
    # the env knobs reach the tabletop itself
    cfg2 = EnvConfig(**{**cfg.__dict__, "layout": "task", "terminate_on_success": True})
    base = make_env(cfg2).unwrapped
    assert base.config.layout == "task" and base.config.terminate_on_success is True
    assert make_env(cfg).unwrapped.config.layout == "random"
