"""Env layer: wrappers against a hand-checkable fake env, normaliser against numpy,
and cheap smoke tests of the Brax / Playground adapters and the registry."""

from __future__ import annotations

import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlinf_jax.config.schema import EnvConfig
from rlinf_jax.envs import (
    ActionRepeat,
    AutoReset,
    EnvState,
    EpisodeStats,
    TimeLimit,
    VmapEnv,
    init_stats,
    list_envs,
    make_env,
    make_eval_env,
    normalize,
    sim_adapter,
    update_stats,
)
from rlinf_jax.envs.brax_env import BRAX_BACKENDS, BraxEnv
from rlinf_jax.envs.normalization import variance
from rlinf_jax.errors import BadInput

KEY = jax.random.PRNGKey(0)


class CounterEnv:
    """Unbatched fake env. obs = [count, offset]; offset ~ U(0, 1) is drawn at reset, so
    it tells which reset an episode came from. Each step: count += 1, reward = new count.
    Terminates when count >= terminate_at or when the action is negative. With
    `success=True`, ``info["success"]`` is 1 on steps whose action is > 0.5.
    """

    observation_size, action_size, num_envs = 2, 1, 1

    def __init__(self, terminate_at: int | None = None, success: bool = False):
        self.terminate_at, self.success = terminate_at, success

    def reset(self, key):
        sim = {"count": jnp.zeros(()), "offset": jax.random.uniform(key)}
        info = {"success": jnp.zeros(())} if self.success else {}
        zero = jnp.zeros((), jnp.float32)
        return EnvState(obs=self._obs(sim), reward=zero, done=zero, truncated=zero, info=info, sim=sim)

    def step(self, state, action):
        count = state.sim["count"] + 1
        sim = {**state.sim, "count": count}
        done = action[0] < 0
        if self.terminate_at is not None:
            done = done | (count >= self.terminate_at)
        info = dict(state.info)
        if self.success:
            info["success"] = (action[0] > 0.5).astype(jnp.float32)
        return state.replace(obs=self._obs(sim), reward=count, done=done.astype(jnp.float32), info=info, sim=sim)

    @staticmethod
    def _obs(sim):
        return jnp.stack([sim["count"], sim["offset"]])


def stack(env, num_envs=2, episode_length=3, mode="cached", auto_reset=True):
    env = EpisodeStats(VmapEnv(TimeLimit(env, episode_length), num_envs))
    return AutoReset(env, mode) if auto_reset else env


def act(*values):
    return jnp.asarray(values, jnp.float32).reshape(-1, 1)


# ---------------------------------------------------------------- wrappers


def test_action_repeat_sums_rewards():
    env = ActionRepeat(CounterEnv(), 3)
    s = env.reset(KEY)
    s = env.step(s, act(1.0)[0])
    assert float(s.reward) == 1 + 2 + 3 and float(s.obs[0]) == 3
    s = env.step(s, act(1.0)[0])
    assert float(s.reward) == 4 + 5 + 6 and float(s.obs[0]) == 6 and float(s.done) == 0


def test_action_repeat_freezes_after_done():
    env = ActionRepeat(CounterEnv(terminate_at=2), 3)
    s = jax.jit(env.step)(env.reset(KEY), act(1.0)[0])
    # Sub-step 3 ran but was discarded: count stops at 2, reward 1 + 2.
    assert float(s.reward) == 3 and float(s.done) == 1 and float(s.obs[0]) == 2
    # Stepping an ended env (no auto-reset) still moves one sub-step, then freezes again.
    s = env.step(s, act(1.0)[0])
    assert float(s.reward) == 3 and float(s.obs[0]) == 3 and float(s.done) == 1


@pytest.mark.parametrize(
    "terminate_at, done_at, truncated",
    [(None, 3, 1.0), (3, 3, 0.0), (2, 2, 0.0)],
    ids=["truncation", "termination-on-last-step", "early-termination"],
)
def test_time_limit(terminate_at, done_at, truncated):
    env = TimeLimit(CounterEnv(terminate_at), 3)
    s = env.reset(KEY)
    assert int(s.info["steps"]) == 0
    for t in range(1, done_at + 1):
        s = env.step(s, act(1.0)[0])
        assert int(s.info["steps"]) == t
        assert float(s.done) == (t == done_at)
        assert float(s.truncated) == (truncated if t == done_at else 0.0)


def test_vmap_env_splits_keys():
    env = VmapEnv(CounterEnv(), 4)
    s = env.reset(KEY)
    assert env.num_envs == 4 and s.obs.shape == (4, 2) and s.done.shape == (4,)
    assert len(set(np.asarray(s.obs[:, 1]).tolist())) == 4  # distinct initial states
    s = env.step(s, act(1, 1, 1, 1))
    np.testing.assert_array_equal(s.obs[:, 0], 1.0)


def test_autoreset_cached_truncation_keeps_final_obs_and_resets_counter():
    env = stack(CounterEnv(), episode_length=3)
    s0 = env.reset(KEY)
    np.testing.assert_array_equal(s0.info["final_obs"], s0.obs)
    step = jax.jit(env.step)
    s = s0
    for _ in range(2):
        s = step(s, act(1, 1))
        np.testing.assert_array_equal(s.info["final_obs"], s.obs)  # not done: equal
    s = step(s, act(1, 1))
    np.testing.assert_array_equal(s.done, 1.0)
    np.testing.assert_array_equal(s.truncated, 1.0)
    np.testing.assert_array_equal(s.reward, 3.0)  # the finishing step's reward
    np.testing.assert_array_equal(s.info["final_obs"][:, 0], 3.0)
    np.testing.assert_array_equal(s.obs, s0.obs)  # cached: the very first state again
    np.testing.assert_array_equal(s.info["steps"], 0)
    np.testing.assert_array_equal(s.info["episode_return"], 6.0)
    np.testing.assert_array_equal(s.info["episode_length"], 3)
    # The next episode counts from scratch and truncates after 3 more steps again.
    s = step(s, act(1, 1))
    np.testing.assert_array_equal(s.info["steps"], 1)
    np.testing.assert_array_equal(s.info["running_return"], 1.0)
    np.testing.assert_array_equal(s.info["episode_return"], 6.0)  # previous episode kept
    s = step(step(s, act(1, 1)), act(1, 1))
    np.testing.assert_array_equal(s.truncated, 1.0)


def test_autoreset_only_touches_finished_envs():
    env = stack(CounterEnv(), episode_length=5)
    s0 = env.reset(KEY)
    s = env.step(env.step(s0, act(1, 1)), act(1, -1))  # env 1 terminates on step 2
    np.testing.assert_array_equal(s.done, [0.0, 1.0])
    np.testing.assert_array_equal(s.truncated, [0.0, 0.0])
    np.testing.assert_array_equal(s.obs[:, 0], [2.0, 0.0])
    np.testing.assert_array_equal(s.info["final_obs"][:, 0], [2.0, 2.0])
    np.testing.assert_array_equal(s.info["steps"], [2, 0])
    assert float(s.info["episode_return"][1]) == 3.0 and int(s.info["episode_length"][1]) == 2
    np.testing.assert_array_equal(s.sim["count"], [2.0, 0.0])
    np.testing.assert_array_equal(s.obs[1], s0.obs[1])


def test_autoreset_fresh_draws_new_initial_states():
    env = stack(CounterEnv(), episode_length=1, mode="fresh")
    s0 = env.reset(jax.random.key(1))  # typed keys work too
    step = jax.jit(env.step)
    s1 = step(s0, act(1, 1))
    s2 = step(s1, act(1, 1))
    np.testing.assert_array_equal(s1.done, 1.0)
    np.testing.assert_array_equal(s1.obs[:, 0], 0.0)
    offsets = np.concatenate([s0.obs[:, 1], s1.obs[:, 1], s2.obs[:, 1]])
    assert len(set(offsets.tolist())) == 6  # every reset drew a new state
    np.testing.assert_array_equal(s1.info["final_obs"][:, 1], s0.obs[:, 1])


@pytest.mark.parametrize("mode", ["cached", "fresh"])
def test_autoreset_structure_is_fixed_and_scans(mode):
    env = stack(CounterEnv(terminate_at=4, success=True), num_envs=3, episode_length=6, mode=mode)
    s = env.reset(KEY)
    assert jax.tree.structure(s) == jax.tree.structure(env.step(s, act(1, 1, 1)))

    def body(s, a):
        s = env.step(s, a)
        return s, (s.done, s.info["episode_return"], s.info["episode_length"])

    actions = jnp.ones((10, 3, 1))
    _, (done, ret, length) = jax.jit(lambda s: jax.lax.scan(body, s, actions))(s)
    # Terminates every 4 steps: returns 1+2+3+4 = 10, lengths 4.
    np.testing.assert_array_equal(np.asarray(done)[:, 0], [0, 0, 0, 1, 0, 0, 0, 1, 0, 0])
    np.testing.assert_array_equal(np.asarray(ret)[np.asarray(done) > 0], 10.0)
    np.testing.assert_array_equal(np.asarray(length)[np.asarray(done) > 0], 4)


def test_episode_stats_success_once():
    env = stack(CounterEnv(success=True), episode_length=3)
    s = env.reset(KEY)
    assert "episode_success" in s.info
    s = env.step(s, act(1.0, 0.0))  # env 0 succeeds on the first step only
    s = env.step(s, act(0.0, 0.0))
    s = env.step(s, act(0.0, 0.0))
    np.testing.assert_array_equal(s.done, 1.0)
    np.testing.assert_array_equal(s.info["episode_success"], [1.0, 0.0])
    s = env.step(s, act(0.0, 0.0))
    np.testing.assert_array_equal(s.info["running_success"], 0.0)  # restarted


def test_episode_stats_without_success_signal_adds_no_key():
    s = stack(CounterEnv()).reset(KEY)
    assert "episode_success" not in s.info and "running_success" not in s.info


def test_no_autoreset_stats_restart_after_done():
    env = stack(CounterEnv(terminate_at=2), auto_reset=False)
    s = env.reset(KEY)
    assert "final_obs" not in s.info
    s = env.step(env.step(s, act(1, 1)), act(1, 1))
    np.testing.assert_array_equal(s.info["episode_return"], 3.0)
    np.testing.assert_array_equal(s.info["running_return"], 0.0)


# ---------------------------------------------------------------- normaliser


def test_running_stats_match_numpy():
    rng = np.random.default_rng(0)
    stats, rows = init_stats(3), []
    update = jax.jit(update_stats)
    for shape in [(5,), (2, 7), (1,), (4, 3, 2)]:
        x = rng.normal(3.0, 2.0, size=shape + (3,)).astype(np.float32)
        mask = rng.random(shape) < 0.6
        stats = update(stats, x, mask)
        rows.append(x[mask])
    all_rows = np.concatenate(rows).astype(np.float64)
    assert float(stats.count) == len(all_rows)
    np.testing.assert_allclose(stats.mean, all_rows.mean(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(variance(stats), all_rows.var(0), rtol=1e-4)
    # Without a mask every row counts.
    x = rng.normal(size=(10, 3)).astype(np.float32)
    full = update_stats(init_stats(3), x)
    np.testing.assert_allclose(full.mean, x.mean(0), atol=1e-6)
    np.testing.assert_allclose(variance(full), x.var(0), rtol=1e-5)


def test_normalize():
    stats = init_stats(2)
    obs = jnp.array([[1.0, -2.0]])
    np.testing.assert_allclose(normalize(stats, obs), obs, rtol=1e-6)  # identity before data
    stats = update_stats(stats, jnp.array([[0.0, 10.0], [2.0, 10.0], [4.0, 10.0]]))
    out = jax.jit(normalize, static_argnames="clip")(stats, jnp.array([[4.0, 11.0]]), clip=5.0)
    np.testing.assert_allclose(out, [[2.0 / np.sqrt(8.0 / 3.0), 5.0]], rtol=1e-5)
    # A masked-out batch leaves the statistics alone.
    same = update_stats(stats, jnp.ones((4, 2)), mask=jnp.zeros(4))
    np.testing.assert_allclose(same.mean, stats.mean)
    np.testing.assert_allclose(same.m2, stats.m2)


# ---------------------------------------------------------------- adapters / registry


@pytest.mark.parametrize("backend", BRAX_BACKENDS)
def test_brax_backends_accepted(backend):
    env = BraxEnv("inverted_pendulum", backend=backend)
    assert (env.observation_size, env.action_size, env.backend) == (4, 1, backend)


def test_brax_make_env_steps_and_autoresets():
    cfg = EnvConfig(suite="brax", name="inverted_pendulum", backend="positional", num_envs=2, episode_length=50)
    env = make_env(cfg)
    s0 = jax.jit(env.reset)(KEY)
    assert s0.obs.shape == (2, 4) and s0.reward.dtype == jnp.float32
    step = jax.jit(env.step)
    s, a = s0, jnp.ones((2, 1))
    for _ in range(20):  # a constant push topples the pole well within 20 steps
        s = step(s, a)
        if bool(s.done.any()):
            break
    assert bool(s.done.all()) and not bool(s.truncated.any())
    assert not np.allclose(s.info["final_obs"], s.obs)
    np.testing.assert_allclose(s.obs, s0.obs)  # cached reset


def test_success_is_known_without_tracing_and_agrees_with_a_trace(monkeypatch):
    from rlinf_jax.envs import sim_adapter
    from rlinf_jax.envs.base import reports_success

    def traced(env):
        return "success" in jax.eval_shape(env.reset, KEY).info

    brax = make_env(EnvConfig(suite="brax", name="inverted_pendulum", backend="positional", num_envs=2))
    table = make_env(EnvConfig(suite="tabletop", name="train", backend="mjx", num_envs=2, episode_length=8))
    assert (reports_success(brax), reports_success(table)) == (traced(brax), traced(table)) == (False, True)
    # A fake env that does not say is traced: both answers.
    for success in (False, True):
        assert reports_success(stack(CounterEnv(success=success))) is success

    # A second env of the same name and backend (the evaluation's) traces nothing.
    calls, eval_shape = [], jax.eval_shape
    monkeypatch.setattr(sim_adapter.jax, "eval_shape", lambda *a, **k: calls.append(a) or eval_shape(*a, **k))
    again = BraxEnv("inverted_pendulum", backend="positional")
    assert (again.observation_size, again.has_success, calls) == (4, False, [])
    assert reports_success(VmapEnv(again, 3)) is False and calls == []


def test_playground_make_env_resets_and_steps():
    # Jitted reset: MJX op-by-op is ~20 s on CPU. Action repeat and fresh resets are
    # covered by the fake env; each roughly doubles this compile.
    cfg = EnvConfig(suite="playground", name="CartpoleBalance", backend="jax", num_envs=2, episode_length=2)
    env = make_env(cfg)
    assert (env.observation_size, env.action_size, env.num_envs) == (5, 1, 2)
    s0 = jax.jit(env.reset)(KEY)
    step = jax.jit(env.step)
    s = step(s0, jnp.zeros((2, 1)))
    assert s.obs.shape == (2, 5) and np.all(np.isfinite(s.obs)) and np.all(np.asarray(s.reward) > 0)
    np.testing.assert_array_equal(s.done, 0.0)
    s = step(s, jnp.zeros((2, 1)))
    np.testing.assert_array_equal(s.truncated, 1.0)
    np.testing.assert_array_equal(s.info["episode_length"], 2)
    np.testing.assert_allclose(s.obs, s0.obs)
    assert not np.allclose(s.info["final_obs"], s0.obs)


def test_list_envs():
    envs = list_envs()
    assert set(envs) == {"brax", "playground", "tabletop"}
    assert "inverted_pendulum" in envs["brax"] and "CartpoleBalance" in envs["playground"]
    assert all(envs[suite] == sorted(envs[suite]) for suite in ("brax", "playground"))
    # The tabletop's "envs" are its splits, training split first.
    assert envs["tabletop"] == ["train", "vision", "semantic", "execution"]


def test_listed_envs_are_the_imported_registries():
    """`list_envs` reads the names from the packages' files; the registries the envs are
    made from hold exactly those."""
    from rlinf_jax.envs.registry import registered_envs
    from rlinf_jax.envs.tabletop import SPLITS

    assert list_envs() == registered_envs()
    assert list_envs()["tabletop"] == list(SPLITS)


def test_list_envs_imports_no_simulator():
    import subprocess
    import sys

    code = ("import sys; from rlinf_jax.envs import list_envs; envs = list_envs(); "
            "print(len(envs['brax']), len(envs['playground']), "
            "[m for m in ('jax', 'brax', 'mujoco', 'mujoco_playground') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    brax, playground, imported = out.split(" ", 2)
    assert int(brax) >= 10 and int(playground) >= 20 and imported.strip() == "[]"


def test_env_names_read_from_a_registry_literal(tmp_path, monkeypatch):
    from rlinf_jax.envs.names import registry_literal_keys

    pkg = tmp_path / "fake_suite"
    (pkg / "envs").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "envs" / "__init__.py").write_text("import os\n_envs = {'b': os.sep, 'a': len}\n")
    (pkg / "envs" / "partial.py").write_text("_envs = {'a': 1, **other}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert registry_literal_keys("fake_suite", "envs/__init__.py") == ["a", "b"]
    # Not a whole literal of string keys, no such file, no such package: not readable.
    assert registry_literal_keys("fake_suite", "envs/partial.py") is None
    assert registry_literal_keys("fake_suite", "envs/missing.py") is None
    assert registry_literal_keys("no_such_package_here", "envs/__init__.py") is None


def test_make_eval_env_has_no_autoreset():
    cfg = EnvConfig(num_eval_envs=3, episode_length=10, action_repeat=3)
    env = make_eval_env(cfg)
    assert isinstance(env, EpisodeStats) and env.num_envs == 3
    shapes = jax.eval_shape(env.reset, KEY)
    assert "final_obs" not in shapes.info and shapes.obs.shape == (3, 4)
    time_limit = env.env.env
    assert isinstance(time_limit, TimeLimit) and time_limit.episode_length == 4  # ceil(10 / 3)


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"suite": "gym"}, "brax, playground"),
        ({"name": "invertedpendulum"}, "did you mean 'inverted_pendulum'"),
        ({"suite": "playground", "name": "CartpoleBalanse", "backend": "jax"}, "did you mean 'CartpoleBalance'"),
        ({"backend": "jax"}, "mjx, generalized, positional, spring"),
        ({"suite": "playground", "name": "CartpoleBalance", "backend": "mjx"}, "jax, warp"),
        ({"num_envs": 0}, "num_envs"),
        ({"episode_length": 0}, "episode_length"),
        ({"action_repeat": 0}, "action_repeat"),
        ({"num_eval_envs": 0}, "num_eval_envs"),
        ({"reset_mode": "lazy"}, "cached, fresh"),
    ],
)
def test_bad_input(change, needle):
    cfg = dataclasses.replace(EnvConfig(), **change)
    with pytest.raises(BadInput) as err:
        make_env(cfg)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_bad_num_envs_argument():
    with pytest.raises(BadInput, match="num_envs"):
        make_env(EnvConfig(), num_envs=0)


def test_missing_brax_asset(monkeypatch):
    from brax import envs as brax_envs

    def missing(**_):
        raise FileNotFoundError(2, "No such file or directory", "/gone/inverted_pendulum.xml")

    monkeypatch.setitem(brax_envs._envs, "inverted_pendulum", missing)
    monkeypatch.setattr(sim_adapter, "_SIMS", {})  # not the env an earlier test loaded
    with pytest.raises(BadInput, match="asset file missing: /gone/inverted_pendulum.xml"):
        make_env(EnvConfig())


def test_missing_playground_asset(monkeypatch):
    from mujoco_playground._src.dm_control_suite import cartpole

    monkeypatch.setattr(cartpole, "_XML_PATH", pathlib.Path("/gone/cartpole.xml"))
    monkeypatch.setattr(sim_adapter, "_SIMS", {})
    cfg = EnvConfig(suite="playground", name="CartpoleBalance", backend="jax")
    with pytest.raises(BadInput, match="CartpoleBalance.*/gone/cartpole.xml"):
        make_env(cfg)
