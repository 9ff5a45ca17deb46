"""Host simulators in worker processes: the same semantics as the JAX wrappers, trajectories
independent of the number of workers, a worker under a second interpreter, a killed or
hung worker replaced, bad env ids refused in one line, processes and memory released."""

from __future__ import annotations

import os
import signal
import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlinf_jax.envs.base import EnvState
from rlinf_jax.envs.host import HostEnvPool, HostEnvSpec, describe
from rlinf_jax.envs.host.pool import RESTART_WINDOW
from rlinf_jax.envs.wrappers import ActionRepeat, AutoReset, EpisodeStats, TimeLimit, VmapEnv
from rlinf_jax.errors import BadInput

pytest.importorskip("gymnasium")
TESTS = Path(__file__).resolve().parent
TOY = "hostsim_toy:HostsimToy-v0"


@pytest.fixture(autouse=True)
def _toy_on_path(monkeypatch):
    # Workers import the toy env's module by name (gymnasium's "module:EnvId").
    monkeypatch.setenv("PYTHONPATH", str(TESTS))


class JaxToy:
    """tests/hostsim_toy.py's point on a line as a functional JAX env."""

    observation_size, action_size, num_envs = 2, 1, 1

    def reset(self, key):
        z = jnp.float32(0.0)
        return EnvState(obs=jnp.zeros(2), reward=z, done=z, truncated=z, info={}, sim={"x": z, "t": jnp.int32(0)})

    def step(self, state, action):
        x = state.sim["x"] + jnp.float32(0.5) * action[0]
        t = state.sim["t"] + 1
        obs = jnp.stack([x, jnp.float32(0.1) * t.astype(jnp.float32)])
        done = (jnp.abs(x) > 1.0).astype(jnp.float32)
        return state.replace(obs=obs, reward=1.0 - x * x, done=done, truncated=jnp.float32(0.0), sim={"x": x, "t": t})


def _jax_stack(num_envs, episode_length, repeat):
    env = TimeLimit(ActionRepeat(JaxToy(), repeat), -(-episode_length // repeat))
    return AutoReset(EpisodeStats(VmapEnv(env, num_envs)), "cached")


def _actions(steps, num_envs, size, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (steps, num_envs, size)).astype(np.float32)


FIELDS = ("obs", "final_obs", "reward", "done", "truncated")


def _host_run(spec, actions, num_workers, num_groups=1, seed=0):
    pool = HostEnvPool(spec, actions.shape[1], num_workers, seed=seed, num_groups=num_groups)
    try:
        out = {k: [] for k in FIELDS + ("episode_return", "episode_length")}
        first = pool.arrays["obs"].copy()
        for a in actions:
            pool.step(a)
            for k in out:
                out[k].append(pool.arrays[k].copy())
        return first, {k: np.stack(v) for k, v in out.items()}
    finally:
        pool.close()


def test_worker_semantics_match_the_jax_wrappers():
    """ActionRepeat (ends inside a repeat), TimeLimit (truncation vs termination),
    EpisodeStats and AutoReset (final observation) agree step by step."""
    B, L, k, T = 6, 7, 2, 40
    actions = _actions(T, B, 1)
    env = _jax_stack(B, L, k)
    state = env.reset(jax.random.PRNGKey(0))
    step = jax.jit(env.step)
    ref = {k_: [] for k_ in FIELDS + ("episode_return", "episode_length")}
    for a in actions:
        state = step(state, jnp.asarray(a))
        got = {"obs": state.obs, "final_obs": state.info["final_obs"], "reward": state.reward, "done": state.done,
               "truncated": state.truncated, "episode_return": state.info["episode_return"],
               "episode_length": state.info["episode_length"]}
        for k_ in ref:
            ref[k_].append(np.asarray(got[k_]))
    ref = {k_: np.stack(v) for k_, v in ref.items()}
    spec = HostEnvSpec(TOY, episode_length=L, action_repeat=k)
    first, host = _host_run(spec, actions, num_workers=2)
    np.testing.assert_array_equal(first, np.zeros((B, 2)))
    # Both kinds of ends happen in this run, so both rules are exercised.
    assert ((ref["done"] > 0) & (ref["truncated"] > 0)).any() and ((ref["done"] > 0) & (ref["truncated"] == 0)).any()
    for k_ in ("done", "truncated"):
        np.testing.assert_array_equal(host[k_], ref[k_], err_msg=k_)
    for k_ in ("obs", "final_obs", "reward"):
        np.testing.assert_allclose(host[k_], ref[k_], atol=1e-5, err_msg=k_)
    done = ref["done"] > 0
    np.testing.assert_allclose(host["episode_return"][done], ref["episode_return"][done], atol=1e-5)
    np.testing.assert_array_equal(host["episode_length"][done], ref["episode_length"][done])


@pytest.mark.parametrize("reset_mode", ["fresh", "cached"])
def test_trajectories_do_not_depend_on_the_number_of_workers(reset_mode):
    spec = describe(HostEnvSpec("InvertedPendulum-v5", episode_length=30, reset_mode=reset_mode))
    actions = _actions(40, 8, 1, seed=1)
    runs = {w: _host_run(spec, actions, num_workers=w, num_groups=2 if w > 1 else 1) for w in (1, 2, 4)}
    first, ref = runs[1]
    assert ref["done"].sum() >= 8  # episodes ended and were reset with their own seeds
    for w in (2, 4):
        np.testing.assert_array_equal(runs[w][0], first)
        for k_ in FIELDS:
            np.testing.assert_array_equal(runs[w][1][k_], ref[k_], err_msg=f"{w} workers, {k_}")
    # Different envs start differently; a cached env replays its first state after a reset.
    assert len({tuple(r) for r in first}) == 8
    ended = np.argwhere(ref["done"] > 0)[0]
    if reset_mode == "cached":
        np.testing.assert_array_equal(ref["obs"][ended[0], ended[1]], first[ended[1]])
    else:
        assert not np.array_equal(ref["obs"][ended[0], ended[1]], first[ended[1]])


def test_a_worker_under_a_second_interpreter(tmp_path):
    """A worker needs numpy and the simulator only: a second virtual environment runs it."""
    from rlinf_jax.envs.install import inheriting_env

    venv = tmp_path / "venv"
    python = inheriting_env(venv)
    assert subprocess.run([python, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True).stdout.strip() == str(venv)
    actions = _actions(20, 4, 1, seed=2)
    spec = HostEnvSpec("InvertedPendulum-v5", episode_length=15, reset_mode="fresh")
    _, ref = _host_run(spec, actions, num_workers=2)
    _, other = _host_run(HostEnvSpec(**{**spec.__dict__, "python": python}), actions, num_workers=2)
    for k_ in FIELDS:
        np.testing.assert_array_equal(other[k_], ref[k_])


def test_a_worker_environment_sees_the_packages_of_the_virtual_environment_it_is_built_from(tmp_path):
    """Built from a plain virtual environment (the README's setup), a worker environment sees
    that environment's packages, which `--system-site-packages` would not (it links the base
    interpreter's), the ones its .pth files add, and its own installs before them."""
    from rlinf_jax.envs.install import inheriting_env

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "parent")], check=True)
    parent = str(tmp_path / "parent" / "bin" / "python")
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    parent_site = Path(subprocess.run([parent, "-c", purelib], capture_output=True, text=True, check=True).stdout.strip())
    (parent_site / "only_in_parent.py").write_text("VALUE = 'parent'\n")
    (parent_site / "shadowed.py").write_text("VALUE = 'parent'\n")
    (tmp_path / "editable").mkdir()
    (tmp_path / "editable" / "editable_pkg.py").write_text("VALUE = 'editable'\n")
    (parent_site / "editable.pth").write_text(str(tmp_path / "editable") + "\n")
    python = inheriting_env(tmp_path / "worker", parent)
    own_site = Path(subprocess.run([python, "-c", purelib], capture_output=True, text=True, check=True).stdout.strip())
    (own_site / "shadowed.py").write_text("VALUE = 'worker'\n")
    probe = "import sys, only_in_parent, editable_pkg, shadowed; print(sys.prefix, only_in_parent.VALUE, editable_pkg.VALUE, shadowed.VALUE)"
    got = subprocess.run([python, "-c", probe], capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
    assert got.stdout.split() == [str(tmp_path / "worker"), "parent", "editable", "worker"], got.stderr


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True  # close() waits for (reaps) its workers, so a pid that answers is still running


def test_a_killed_worker_is_replaced_and_its_episodes_end(tmp_path):
    spec = HostEnvSpec("InvertedPendulum-v5", episode_length=1000, reset_mode="fresh")
    pool = HostEnvPool(spec, 4, 2, seed=0, step_timeout_s=30)
    try:
        pool.step(np.zeros((4, 1), np.float32))
        victim = pool.workers[1].proc.pid
        os.kill(victim, signal.SIGKILL)
        pool.step(np.zeros((4, 1), np.float32))
        assert pool.restarts == 1 and pool.workers[1].proc.pid != victim
        np.testing.assert_array_equal(pool.arrays["done"], [0, 0, 1, 1])
        np.testing.assert_array_equal(pool.arrays["truncated"], [0, 0, 1, 1])
        np.testing.assert_array_equal(pool.arrays["episode_index"], [0, 0, 1, 1])
        np.testing.assert_array_equal(pool.arrays["episode_length"][2:], [1, 1])
        pool.step(np.zeros((4, 1), np.float32))  # the replacement steps on
        np.testing.assert_array_equal(pool.arrays["done"], 0)
        pids = [w.proc.pid for w in pool.workers]
    finally:
        pool.close()
    assert not any(_alive(p) for p in pids)


@pytest.mark.parametrize("failure", ["hang_file", "crash_file"])
def test_a_hung_or_crashed_worker_never_hangs_the_run(tmp_path, failure):
    # Sizes given: describing the env would take its one failing step itself.
    spec = HostEnvSpec(TOY, episode_length=50, env_kwargs={failure: str(tmp_path / "once")}, observation_size=2,
                       action_size=1)
    pool = HostEnvPool(spec, 2, 1, seed=0, step_timeout_s=3)
    try:
        pool.step(np.zeros((2, 1), np.float32))  # the first step fails: hangs (3 s deadline) or exits
        assert pool.restarts == 1
        np.testing.assert_array_equal(pool.arrays["truncated"], [1, 1])
        pool.step(np.full((2, 1), 0.5, np.float32))
        np.testing.assert_allclose(pool.arrays["obs"][:, 0], 0.25)
    finally:
        pool.close()


def _steps_until_stopped(crash_every, max_restarts, steps):
    """Steps a pool of the toy crashing every ``crash_every`` steps: (steps taken, restarts,
    the one-line error that stopped it or None)."""
    spec = HostEnvSpec(TOY, episode_length=10_000, env_kwargs={"crash_every": crash_every}, observation_size=2,
                       action_size=1)
    pool = HostEnvPool(spec, 2, 1, seed=0, max_restarts=max_restarts)
    try:
        for t in range(1, steps + 1):
            try:
                pool.step(np.zeros((2, 1), np.float32))
            except BadInput as e:
                return t, pool.restarts, str(e)
        return steps, pool.restarts, None
    finally:
        pool.close()


def test_a_simulator_that_keeps_crashing_stops_in_one_line():
    """A crash every 3rd step: the third replacement within RESTART_WINDOW steps is one
    more than max_restarts=2, and stops the pool with one line naming the env, the last
    worker's exit code and what it printed last."""
    steps, restarts, error = _steps_until_stopped(crash_every=3, max_restarts=2, steps=50)
    assert (steps, restarts) == (9, 3)
    assert "\n" not in error
    assert error.startswith(
        "env.name='hostsim_toy:HostsimToy-v0' keeps failing: 3 env worker replacements within 100 steps, more than "
        "env.max_worker_restarts=2; the last, worker 0 (envs 0-1): exited with code 3; its last output: "
        "toy simulator: giving up at step 3."
    ), error
    assert error.endswith("or raise env.max_worker_restarts")


def test_crashes_further_apart_than_the_window_never_stop_the_pool():
    """The cap counts replacements within RESTART_WINDOW steps, not over the run: a crash
    every 110 steps is replaced for ever under max_restarts=1, one every 40 steps stops."""
    assert RESTART_WINDOW == 100
    assert _steps_until_stopped(crash_every=110, max_restarts=1, steps=340) == (340, 3, None)
    steps, restarts, error = _steps_until_stopped(crash_every=40, max_restarts=1, steps=340)
    assert (steps, restarts) == (80, 2) and "2 env worker replacements within 100 steps" in error


def test_a_worker_that_does_not_start_says_why_in_one_line(tmp_path):
    # An interpreter that never answers: a script that sleeps whatever it is given.
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho starting the simulator >&2\nexec sleep 30\n")
    python.chmod(0o755)
    with pytest.raises(BadInput) as e:
        describe(HostEnvSpec(TOY, episode_length=5, python=str(python)), timeout_s=1.5)
    assert str(e.value) == (
        f"env.name='{TOY}' cannot be made by {python}: no answer in 1.5 s (env.worker_start_timeout_s=1.5); "
        "its last output: starting the simulator"
    )
    with pytest.raises(BadInput) as e:
        HostEnvPool(HostEnvSpec(TOY, episode_length=5, python=str(python), observation_size=2, action_size=1), 2, 1,
                    seed=0, start_timeout_s=1.5)
    assert str(e.value) == (
        f"env worker 0 (env.name='{TOY}', envs 0-1) did not start: no answer in 1.5 s "
        "(env.worker_start_timeout_s=1.5); its last output: starting the simulator"
    )
    # One that exits before it can answer (the worker's own imports failed) is named by its
    # exit code and last words at once, not after the timeout.
    python.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'numpy'\" >&2\nexit 1\n")
    with pytest.raises(BadInput) as e:
        describe(HostEnvSpec(TOY, episode_length=5, python=str(python)), timeout_s=60)
    assert str(e.value).startswith(
        f"env.name='{TOY}' cannot be made by {python}: exited with code 1; its last output: ModuleNotFoundError: "
        "No module named 'numpy' (install the simulator for that interpreter"
    )


def test_unknown_env_id_is_refused_in_one_line():
    with pytest.raises(BadInput) as e:
        describe(HostEnvSpec("InvertedPendulumm-v5", episode_length=10))
    msg = str(e.value)
    assert "\n" not in msg and "InvertedPendulumm-v5" in msg and "doesn't exist" in msg


def test_a_missing_interpreter_is_refused_in_one_line(tmp_path):
    with pytest.raises(BadInput, match="worker_python"):
        describe(HostEnvSpec("InvertedPendulum-v5", episode_length=10, python=str(tmp_path / "nope")))


def test_workers_run_on_the_cores_they_are_given():
    last = max(os.sched_getaffinity(0))
    pool = HostEnvPool(HostEnvSpec(TOY, episode_length=5, cpus=(last,)), 2, 2, seed=0)
    try:
        for w in pool.workers:
            assert os.sched_getaffinity(w.proc.pid) == {last}
    finally:
        pool.close()


def test_bad_worker_cores_are_refused_in_one_line():
    from rlinf_jax.config import load_config
    from rlinf_jax.envs.host.suite import host_spec

    for value, words in (("[0,0]", "distinct core numbers"), (f"[{os.cpu_count()}]", "which this machine does not have")):
        cfg = load_config("ppo_gym_mujoco", [f"env.worker_cpus={value}"])
        with pytest.raises(BadInput, match=words) as e:
            host_spec(cfg.env)
        assert "\n" not in str(e.value)


def test_bad_restart_caps_and_start_timeouts_are_refused_in_one_line():
    from rlinf_jax.config import load_config
    from rlinf_jax.envs.host.suite import host_spec

    for override, words in (("env.max_worker_restarts=-1", "env.max_worker_restarts must be an integer >= 0"),
                            ("env.worker_start_timeout_s=0", "env.worker_start_timeout_s must be > 0, got 0")):
        with pytest.raises(BadInput, match=words) as e:
            host_spec(load_config("ppo_gym_mujoco", [override]).env)
        assert "\n" not in str(e.value)


def test_close_frees_the_shared_block_and_is_idempotent():
    pool = HostEnvPool(HostEnvSpec(TOY, episode_length=5), 2, 2, seed=0)
    name = pool._shm.name
    assert os.path.exists(f"/dev/shm/{name}")
    pool.close()
    pool.close()
    assert not os.path.exists(f"/dev/shm/{name}")


class MjxInvertedPendulum:
    """Gymnasium's InvertedPendulum-v5 written as a functional JAX env on MJX: the same
    XML (read from gymnasium's own model), frame skip, action scaling, reward and
    termination, starting from a given state."""

    observation_size, action_size, num_envs = 4, 1, 1

    def __init__(self, qpos0, qvel0):
        import gymnasium as gym
        from mujoco import mjx

        env = gym.make("InvertedPendulum-v5").unwrapped
        self.mjx, self.frame_skip = mjx, env.frame_skip
        self.model = mjx.put_model(env.model)
        self.data0 = mjx.put_data(env.model, env.data).replace(qpos=jnp.asarray(qpos0), qvel=jnp.asarray(qvel0))
        self.low, self.high = env.action_space.low, env.action_space.high
        env.close()

    def _obs(self, d):
        return jnp.concatenate([d.qpos, d.qvel]).astype(jnp.float32)

    def reset(self, key):
        z = jnp.float32(0.0)
        return EnvState(obs=self._obs(self.data0), reward=z, done=z, truncated=z, info={}, sim=self.data0)

    def step(self, state, action):
        ctrl = self.low + (jnp.clip(action, -1, 1) + 1.0) * 0.5 * (self.high - self.low)
        d = state.sim.replace(ctrl=ctrl)
        for _ in range(self.frame_skip):
            d = self.mjx.step(self.model, d)
        obs = self._obs(d)
        done = (~jnp.all(jnp.isfinite(obs)) | (jnp.abs(obs[1]) > 0.2)).astype(jnp.float32)
        return state.replace(obs=obs, reward=jnp.float32(1.0), done=done, truncated=jnp.float32(0.0), sim=d)


@pytest.mark.slow
def test_c_mujoco_in_a_worker_and_mjx_under_the_jax_wrappers_agree():
    """InvertedPendulum-v5: C MuJoCo stepped by gymnasium in a worker, and the same XML
    stepped by MJX under TimeLimit / EpisodeStats / AutoReset, give the same trajectory
    (terminations, truncations and cached resets included)."""
    T, L = 40, 12
    rng = np.random.default_rng(4)
    # Small actions first (the pole stays up until the time limit), then large ones (it falls).
    actions = np.concatenate([rng.uniform(-0.05, 0.05, (16, 1, 1)), rng.uniform(-1, 1, (T - 16, 1, 1))]).astype(np.float32)
    first, host = _host_run(HostEnvSpec("InvertedPendulum-v5", episode_length=L, reset_mode="cached"), actions, 1)
    twin = MjxInvertedPendulum(first[0, :2], first[0, 2:])
    env = AutoReset(EpisodeStats(VmapEnv(TimeLimit(twin, L), 1)), "cached")
    state = env.reset(jax.random.PRNGKey(0))
    step = jax.jit(env.step)
    ref = {k_: [] for k_ in FIELDS}
    for a in actions:
        state = step(state, jnp.asarray(a))
        for k_, v in (("obs", state.obs), ("final_obs", state.info["final_obs"]), ("reward", state.reward),
                      ("done", state.done), ("truncated", state.truncated)):
            ref[k_].append(np.asarray(v))
    ref = {k_: np.stack(v) for k_, v in ref.items()}
    assert ((ref["done"] > 0) & (ref["truncated"] > 0)).any() and ((ref["done"] > 0) & (ref["truncated"] == 0)).any()
    np.testing.assert_array_equal(host["done"], ref["done"])
    np.testing.assert_array_equal(host["truncated"], ref["truncated"])
    np.testing.assert_allclose(host["obs"], ref["obs"], atol=1e-4)
    np.testing.assert_allclose(host["final_obs"], ref["final_obs"], atol=1e-4)


def test_a_worker_killed_with_both_micro_batches_pending():
    """Every worker holds a slice of each micro-batch; one killed while both are in
    flight is replaced once, and its envs of both micro-batches end."""
    spec = HostEnvSpec("InvertedPendulum-v5", episode_length=1000, reset_mode="fresh")
    pool = HostEnvPool(spec, 8, 2, seed=0, num_groups=2, step_timeout_s=30)
    try:
        assert pool.slices == [[(0, 2), (4, 6)], [(2, 4), (6, 8)]]
        pool.arrays["action"][:] = 0
        os.kill(pool.workers[0].proc.pid, signal.SIGKILL)
        pool.send(0)
        pool.send(1)
        pool.wait(0)
        pool.wait(1)
        assert pool.restarts == 1
        np.testing.assert_array_equal(pool.arrays["truncated"], [1, 1, 0, 0, 1, 1, 0, 0])
        pool.step()
        np.testing.assert_array_equal(pool.arrays["done"], 0)
    finally:
        pool.close()


def test_worker_environment_names_resolve_or_are_refused_in_one_line(tmp_path):
    from rlinf_jax.envs.install import resolve_worker_python

    assert resolve_worker_python("") == sys.executable
    assert resolve_worker_python("/opt/py/bin/python") == "/opt/py/bin/python"
    for name, words in (("robosuitee", "neither an interpreter"), ("metaworld", "python -m rlinf_jax.envs.install metaworld")):
        with pytest.raises(BadInput) as e:
            resolve_worker_python(name, root=tmp_path)
        assert words in str(e.value) and "\n" not in str(e.value)
    (tmp_path / "metaworld").mkdir()
    (tmp_path / "metaworld" / "python.txt").write_text(sys.executable + "\n")
    assert resolve_worker_python("metaworld", root=tmp_path) == sys.executable


def test_the_install_command_explains_itself_in_whole_sentences(capsys):
    from rlinf_jax.envs.install import main

    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    paragraphs = capsys.readouterr().out.split("\n\n")
    description = " ".join(paragraphs[1].split())
    assert description == (
        "Builds the virtual environment of a host simulator whose pins conflict with ours, from the package registry, "
        "and records its interpreter: env.worker_python=NAME runs the env workers under it (docs/simulators.md)."
    )
    assert "the simulator whose environment to build" in " ".join(paragraphs[2].split())


def test_metaworld_in_its_own_worker_environment():
    """MetaWorld pins mujoco 3.3.0 against our 4.x: its workers run under the interpreter
    `python -m rlinf_jax.envs.install metaworld` recorded, and report success."""
    from rlinf_jax.envs.install import recorded_python

    try:
        python = recorded_python("metaworld")
    except BadInput as e:
        pytest.skip(str(e))
    version = subprocess.run([python, "-c", "import mujoco; print(mujoco.__version__)"], capture_output=True, text=True)
    assert version.stdout.strip().startswith("3.")
    spec = describe(HostEnvSpec("metaworld:Meta-World/MT1", episode_length=20, python=python,
                                env_kwargs={"env_name": "reach-v3"}, reset_mode="fresh"))
    assert (spec.observation_size, spec.action_size, spec.has_success) == (39, 4, True)
    first, run = _host_run(spec, _actions(25, 4, 4, seed=5), num_workers=2)
    assert len({tuple(r) for r in first}) == 4  # goals drawn per env seed
    np.testing.assert_array_equal(run["done"][19], 1)  # the 20-step time limit
    np.testing.assert_array_equal(run["truncated"][19], 1)


ROBOSUITE_DIRECT = """
import json, sys
import numpy as np
import robosuite
from robosuite.wrappers import GymWrapper
seeds, actions = json.loads(sys.argv[1])
out = []
for env_index, seed in enumerate(seeds):
    # robosuite stepped alone (no worker, no shared memory, no time limit of ours), its
    # generator put in the state the worker's seeded reset puts it in.
    env = GymWrapper(robosuite.make("Lift", robots="Panda", has_renderer=False, has_offscreen_renderer=False,
                                    use_camera_obs=False, reward_shaping=True, control_freq=20, ignore_done=True,
                                    horizon=1000))
    env.env.rng.bit_generator.state = np.random.default_rng(seed).bit_generator.state
    np.random.seed(seed % 2**32)
    obs, _ = env.reset()
    rows = [obs.tolist()]
    for a in actions:
        obs, reward, *_ = env.step(np.asarray(a[env_index]))
        rows.append(obs.tolist() + [reward])
    out.append(rows)
print(json.dumps(out))
"""


def test_robosuite_lift_in_its_own_worker_environment():
    """robosuite 1.5.2 fails with mujoco 4: its workers run under the interpreter
    `python -m rlinf_jax.envs.install robosuite` recorded. Seeded episodes, stepped by the
    workers as robosuite steps alone, ended by our time limit; success is reported."""
    from rlinf_jax.envs.host.worker import episode_seed
    from rlinf_jax.envs.install import recorded_python

    try:
        python = recorded_python("robosuite")
    except BadInput as e:
        pytest.skip(str(e))
    spec = describe(HostEnvSpec("robosuite:Lift", episode_length=6, python=python, reset_mode="fresh"))
    assert (spec.observation_size, spec.action_size, spec.has_success) == (60, 7, True)
    actions = _actions(8, 4, 7, seed=2)
    first, run = _host_run(spec, actions, num_workers=2, seed=3)
    assert len({tuple(r) for r in first}) == 4  # cube positions drawn per env seed
    again, rerun = _host_run(spec, actions, num_workers=1, seed=3)  # whatever the number of workers
    np.testing.assert_array_equal(first, again)
    np.testing.assert_allclose(run["obs"], rerun["obs"], atol=1e-6)
    np.testing.assert_array_equal(run["done"][5], 1)  # our 6-step limit, as a truncation
    np.testing.assert_array_equal(run["truncated"][5], 1)
    seeds = [episode_seed(3, g, 0) for g in range(4)]
    direct = subprocess.run([python, "-c", ROBOSUITE_DIRECT, json.dumps([seeds, actions[:5].tolist()])],
                            capture_output=True, text=True, check=True)
    ref = np.asarray(json.loads(direct.stdout.strip().splitlines()[-1]), dtype=object)
    for g in range(4):
        np.testing.assert_allclose(first[g], ref[g][0], atol=1e-5)
        for t in range(5):
            np.testing.assert_allclose(run["obs"][t, g], ref[g][t + 1][:-1], atol=1e-4)
            assert run["reward"][t, g] == pytest.approx(ref[g][t + 1][-1], abs=1e-5)


@pytest.mark.slow
def test_ppo_robosuite_lift_runs_on_tiny_settings(tmp_path):
    from rlinf_jax.envs.install import recorded_python
    from rlinf_jax.runtime import read_metrics
    from rlinf_jax.cli.train import main

    try:
        recorded_python("robosuite")
    except BadInput as e:
        pytest.skip(str(e))
    assert main(["--config-name", "ppo_robosuite_lift", "env.num_envs=4", "env.num_workers=2", "env.num_eval_envs=2",
                 "env.episode_length=20", "algorithm.rollout_length=8", "runner.max_steps=2",
                 "runner.eval_interval=2", "runner.progress_bar=false", "runner.tensorboard=false",
                 f"runner.output_dir={tmp_path}"]) == 0
    last = read_metrics(tmp_path / "ppo_robosuite_lift")[-1]
    assert last["step"] == 2 and np.isfinite(last["train/total_loss"])
    assert "eval/success" in last and 0.0 <= last["eval/success"] <= 1.0
