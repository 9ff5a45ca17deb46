"""One env worker process: steps a slice of a host simulator's env batch in place, in
shared memory.

This file is run as a script (``python worker.py SPEC_JSON``), never imported by the
package's parent process: it imports only the standard library, numpy and the simulator,
so it can run under another Python interpreter (``env.worker_python``) whose pins would
conflict with JAX's (robosuite, MetaWorld, ...).

Protocol. The parent creates one shared-memory block holding every array of the whole
batch (layout in the spec: name -> offset, dtype, shape) and two pipes. It writes actions
into ``action`` and sends a one-line command; the worker steps its envs of that group
(micro-batch; a worker holds a slice ``[lo, hi)`` of every group), writes the results
into the same block and answers ``ok``. No array is ever pickled.

    commands:  step GROUP | reset SEED | restart | close
    answers:   ok | err MESSAGE          (the first line is ``ready {json description}``)

Semantics per env, matching the JAX wrapper stack of `rlinf_jax.envs.registry`
(ActionRepeat -> TimeLimit -> VmapEnv -> EpisodeStats -> AutoReset), which
tests/test_hostsim.py checks side by side:

- the action (in [-1, 1], the squashed policy's range) is scaled to the env's Box bounds
  and applied ``action_repeat`` times, rewards summed, stopping at the first end;
- ``steps`` counts agent steps; at ``time_limit`` the episode ends as a truncation unless
  the env terminated on that step; an env's own ``truncated`` is a truncation too;
- at an end ``episode_return`` / ``episode_length`` (/ ``episode_success``) hold the
  episode's totals, ``final_obs`` the observation it ended on, and ``obs`` is already the
  next episode's first observation (auto-reset);
- episode ``e`` of env ``g`` (its global index) resets with the seed drawn from
  ``SeedSequence([seed, g, e])`` (``e`` stays 0 in reset mode "cached": each env replays
  its first episode's initial state, Brax's way), so trajectories do not depend on how
  the batch is cut into workers (or processes: a pool of a multi-host run holds the
  envs from ``first_env`` on, its rows of the global batch).

Every per-env counter lives in the shared block, so a restarted worker continues where
the crashed one stopped: ``restart`` ends every episode of its slice as a truncation
(reward 0, bootstrapped from the last observation written) and resets them.
"""

from __future__ import annotations

import json
import mmap
import os
import sys
import traceback

import numpy as np


def episode_seed(seed: int, env_index: int, episode: int) -> int:
    """The reset seed of episode ``episode`` of the env with global index ``env_index``."""
    return int(np.random.SeedSequence([seed, env_index, episode]).generate_state(1)[0])


ROBOSUITE = "robosuite:"
LIBERO = "libero:"


def make_env(env_id: str, kwargs: dict, max_base_steps: int, camera: str = "", image_size: int = 0,
             assets_dir: str = ""):
    # The simulator is imported here, in the worker only: the parent needs none of it.
    if env_id.startswith(LIBERO):
        # The file beside this one: workers always run as scripts, this folder on sys.path.
        from libero_task import libero_env

        return libero_env(env_id, kwargs, max_base_steps, camera, image_size, assets_dir)
    if env_id.startswith(ROBOSUITE):
        return robosuite_env(env_id[len(ROBOSUITE) :], kwargs, max_base_steps, camera, image_size)
    if camera:
        raise ValueError(f"camera observations are available for robosuite envs only, not {env_id!r}")
    import gymnasium as gym

    # The time limit is ours (agent steps, TimeLimit's semantics); gymnasium's own is set
    # to exactly the base steps ours allows, so it never ends an episode earlier.
    return gym.make(env_id, max_episode_steps=max_base_steps, **kwargs)


def robosuite_env(name: str, kwargs: dict, max_base_steps: int, camera: str = "", image_size: int = 0):
    """robosuite's ``name`` (Lift, Stack, Door, PickPlace, ...) as a Gymnasium env with flat
    state observations (robosuite's own ``GymWrapper``), seeded by ``reset(seed=...)`` and
    reporting ``info["success"]``. ``kwargs`` go to ``robosuite.make`` over these defaults:
    a Panda arm, no renderer and no camera, shaped rewards, 20 Hz control.

    With ``camera`` (e.g. ``agentview``) the observation is ``{"state": the same flat
    vector, "image": uint8 [image_size, image_size, 3]}``, rendered offscreen (EGL unless
    ``MUJOCO_GL`` names another backend), rows top to bottom."""
    if camera:
        # Read by mujoco at import: set before robosuite imports it. EGL renders headless on
        # a CPU (Mesa) as on a GPU; MUJOCO_GL=osmesa is the fallback where EGL is missing.
        os.environ.setdefault("MUJOCO_GL", "egl")
    import gymnasium as gym
    import robosuite  # the simulator: only in robosuite's worker environment
    from gymnasium import spaces
    from robosuite.wrappers import GymWrapper

    settings = {"robots": "Panda", "has_renderer": False, "has_offscreen_renderer": False, "use_camera_obs": False,
                "reward_shaping": True, "control_freq": 20, **kwargs}
    if camera:
        settings.update(has_offscreen_renderer=True, use_camera_obs=True, camera_names=camera,
                        camera_heights=image_size, camera_widths=image_size)
    # (robosuite's default hard_reset=True rebuilds the sim at every reset: slower, but with
    # hard_reset=False two envs seeded alike start up to 1 mm apart.)
    # The episode ends by our time limit, as a truncation: robosuite's own horizon would
    # report it as a termination (and so cut the value bootstrap).
    settings.update(ignore_done=True, horizon=max_base_steps + 1)
    suite_env = robosuite.make(name, **settings)
    # The state vector's keys in GymWrapper's own order, so that a camera run's state is
    # exactly the state-only run's observation.
    state_keys = (["object-state"] if suite_env.use_object_obs else []) + [
        f"robot{i}_proprio-state" for i in range(len(suite_env.robots))
    ]
    image_key = f"{camera}_image"

    class Seeded(gym.Wrapper):
        def __init__(self, env):
            super().__init__(env)
            if camera:
                size = sum(int(np.prod(env.observation_space[k].shape)) for k in state_keys)
                self.observation_space = spaces.Dict({
                    "state": spaces.Box(-np.inf, np.inf, (size,), np.float32),
                    "image": spaces.Box(0, 255, (image_size, image_size, 3), np.uint8),
                })

        def _obs(self, obs):
            if not camera:
                return obs
            # robosuite renders OpenGL's way, bottom row first: flipped to the image's rows.
            state = np.concatenate([np.asarray(obs[k], np.float32).ravel() for k in state_keys])
            return {"state": state, "image": np.ascontiguousarray(obs[image_key][::-1])}

        def reset(self, *, seed=None, options=None):
            if seed is not None:
                # robosuite draws initial states from the Generator it was built with (its
                # placement samplers hold that object): re-seed it in place.
                suite_env.rng.bit_generator.state = np.random.default_rng(seed).bit_generator.state
                np.random.seed(seed % 2**32)
            obs, info = self.env.reset()
            return self._obs(obs), info

        def step(self, action):
            obs, reward, terminated, truncated, info = self.env.step(action)
            return self._obs(obs), reward, terminated, truncated, {**info, "success": bool(suite_env._check_success())}

    if camera:
        return Seeded(GymWrapper(suite_env, keys=[*state_keys, image_key], flatten_obs=False))
    return Seeded(GymWrapper(suite_env))


def describe(env) -> dict:
    from gymnasium import spaces  # the simulator's package, as in make_env

    obs_space, act_space = env.observation_space, env.action_space
    image_shape = []
    if isinstance(obs_space, spaces.Dict) and set(obs_space.spaces) == {"state", "image"}:
        # A camera env (`robosuite_env`): the image travels in its own uint8 array.
        image_shape = list(obs_space["image"].shape)
        obs_space = obs_space["state"]
    if not isinstance(obs_space, spaces.Box) or not isinstance(act_space, spaces.Box):
        raise TypeError(
            f"only Box observation and action spaces are supported, got {type(obs_space).__name__} and "
            f"{type(act_space).__name__}"
        )
    low, high = act_space.low.astype(np.float64).ravel(), act_space.high.astype(np.float64).ravel()
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
        raise TypeError("the action space is unbounded; the policy's actions in [-1, 1] cannot be scaled to it")
    return {
        "observation_size": int(np.prod(obs_space.shape)),
        "image_shape": image_shape,
        "action_size": int(np.prod(act_space.shape)),
        "action_low": low.tolist(),
        "action_high": high.tolist(),
    }


class Block:
    """Numpy views of the parent's shared-memory block (POSIX shared memory lives in
    /dev/shm; mapping the file directly leaves its lifetime to the parent alone)."""

    def __init__(self, name: str, size: int, layout: dict):
        fd = os.open(os.path.join("/dev/shm", name.lstrip("/")), os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.arrays = {
            key: np.ndarray(tuple(shape), np.dtype(dtype), buffer=self._map, offset=offset)
            for key, (offset, dtype, shape) in layout.items()
        }

    def close(self) -> None:
        self.arrays.clear()
        try:
            self._map.close()
        except BufferError:  # a view still alive (an exception's frame): the exit unmaps it
            pass


class Slice:
    """The worker's envs ``[lo, hi)`` and the semantics above."""

    def __init__(self, spec: dict, arrays: dict):
        self.lo, self.hi = spec["lo"], spec["hi"]
        self.first_env = int(spec.get("first_env", 0))  # the global index of the pool's env 0
        self.seed = int(spec["seed"])
        self.repeat = int(spec["action_repeat"])
        self.limit = int(spec["time_limit"])
        self.cached = spec["reset_mode"] == "cached"
        self.a = {k: v[self.lo : self.hi] for k, v in arrays.items()}
        self.envs = [
            make_env(spec["env_id"], spec.get("env_kwargs", {}), self.limit * self.repeat, spec.get("camera", ""),
                     int(spec.get("image_size", 0)), spec.get("assets_dir", ""))
            for _ in range(self.hi - self.lo)
        ]
        self.camera = "image" in self.a
        d = describe(self.envs[0])
        self.low, self.high = np.asarray(d["action_low"]), np.asarray(d["action_high"])

    def close(self) -> None:
        self.a = {}  # views into the block: dropped so that the block can unmap
        for env in self.envs:
            env.close()

    def _reset_one(self, i: int) -> None:
        a = self.a
        episode = 0 if self.cached else int(a["episode_index"][i])
        obs, info = self.envs[i].reset(seed=episode_seed(self.seed, self.first_env + self.lo + i, episode))
        self._write("obs", "image", i, obs)
        a["steps"][i] = 0
        a["running_return"][i] = 0.0
        a["running_length"][i] = 0
        a["running_success"][i] = float(_success(info))

    def _write(self, state_key: str, image_key: str, i: int, obs) -> None:
        """Env ``i``'s observation into the block: the state vector, and the camera image
        into its own uint8 array."""
        if self.camera:
            self.a[image_key][i] = obs["image"]
            obs = obs["state"]
        self.a[state_key][i] = np.asarray(obs, np.float32).ravel()

    def _copy_final(self) -> None:
        self.a["final_obs"][:] = self.a["obs"]
        if self.camera:
            self.a["final_image"][:] = self.a["image"]

    def reset(self, seed: int) -> None:
        """Starts every env's episode 0 under ``seed`` (statistics cleared)."""
        self.seed = int(seed)
        for key in ("reward", "done", "truncated", "episode_return", "episode_length", "episode_success"):
            self.a[key][:] = 0
        self.a["episode_index"][:] = 0
        for i in range(len(self.envs)):
            self._reset_one(i)
        self._copy_final()

    def resume(self) -> None:
        """Starts the episodes the shared counters name (a new worker, or a resumed run)."""
        for i in range(len(self.envs)):
            self._reset_one(i)
        self._copy_final()

    def restart(self) -> None:
        """A replacement worker: every episode of the slice ends as a truncation."""
        a = self.a
        self._copy_final()
        a["reward"][:] = 0.0
        a["done"][:] = 1.0
        a["truncated"][:] = 1.0
        a["episode_return"][:] = a["running_return"]
        a["episode_length"][:] = a["running_length"]
        a["episode_success"][:] = a["running_success"]
        a["episode_index"][:] += 1
        for i in range(len(self.envs)):
            self._reset_one(i)

    def step(self) -> None:
        a = self.a
        actions = np.clip(a["action"].astype(np.float64), -1.0, 1.0)
        actions = self.low + (actions + 1.0) * 0.5 * (self.high - self.low)
        for i, env in enumerate(self.envs):
            total = np.float32(0.0)
            terminated = env_truncated = False
            success = False
            for _ in range(self.repeat):
                obs, reward, terminated, env_truncated, info = env.step(actions[i].reshape(env.action_space.shape))
                total = np.float32(total + np.float32(reward))
                success = success or _success(info)
                if terminated or env_truncated:
                    break
            steps = int(a["steps"][i]) + 1
            hit = steps >= self.limit
            ended = bool(terminated or env_truncated)
            done = ended or hit
            # TimeLimit's rule: an end the env itself reports keeps its own flag; otherwise
            # the time limit is a truncation.
            truncated = (env_truncated and not terminated) if ended else hit
            ret = np.float32(a["running_return"][i] + total)
            length = int(a["running_length"][i]) + 1
            reached = max(float(a["running_success"][i]), float(success))
            a["reward"][i] = total
            a["done"][i] = float(done)
            a["truncated"][i] = float(truncated)
            self._write("final_obs", "final_image", i, obs)
            if done:
                a["episode_return"][i] = ret
                a["episode_length"][i] = length
                a["episode_success"][i] = reached
                a["episode_index"][i] += 1
                self._reset_one(i)
            else:
                a["obs"][i] = a["final_obs"][i]
                if self.camera:
                    a["image"][i] = a["final_image"][i]
                a["steps"][i] = steps
                a["running_return"][i] = ret
                a["running_length"][i] = length
                a["running_success"][i] = reached


def _success(info) -> bool:
    # MetaWorld reports "success", robosuite-style wrappers "is_success".
    for key in ("success", "is_success"):
        if key in info:
            return bool(np.asarray(info[key]).any())
    return False


def _send(fd: int, text: str) -> None:
    data = (text.replace("\n", " ") + "\n").encode()
    while data:
        data = data[os.write(fd, data) :]


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    if spec.get("cpus"):
        # Before the simulator is imported: threads it starts inherit the pinning.
        os.sched_setaffinity(0, spec["cpus"])
    cmd = os.fdopen(spec["cmd_fd"], "rb", buffering=0)
    reply = spec["reply_fd"]
    block = None
    work = None
    try:
        if spec.get("describe_only"):
            env = make_env(spec["env_id"], spec.get("env_kwargs", {}), 2, spec.get("camera", ""),
                           int(spec.get("image_size", 0)), spec.get("assets_dir", ""))
            try:
                d = describe(env)
                # Whether the env reports success (MetaWorld's info["success"]): one step shows it.
                env.reset(seed=0)
                info = env.step(((np.asarray(d["action_low"]) + np.asarray(d["action_high"])) / 2).reshape(env.action_space.shape))[4]
                d["has_success"] = any(k in info for k in ("success", "is_success"))
                # A task's own instruction (LIBERO's), for a VLA's tokens.
                d["instruction"] = str(getattr(env.unwrapped, "instruction", ""))
                _send(reply, "ready " + json.dumps(d))
            finally:
                env.close()
            return 0
        block = Block(spec["shm_name"], spec["shm_size"], spec["layout"])
        # One slice of every micro-batch: the workers step each micro-batch together.
        work = [Slice({**spec, "lo": lo, "hi": hi}, block.arrays) for lo, hi in spec["slices"]]
        for part in work:
            if spec.get("restart"):
                part.restart()
            elif spec.get("resume"):
                part.resume()
        _send(reply, "ready {}")
        for line in iter(cmd.readline, b""):
            words = line.decode().split()
            if not words:
                continue
            try:
                if words[0] == "step":
                    work[int(words[1])].step()
                elif words[0] == "reset":
                    for part in work:
                        part.reset(int(words[1]))
                elif words[0] == "restart":
                    for part in work:
                        part.restart()
                elif words[0] == "close":
                    _send(reply, "ok")
                    return 0
                else:
                    raise ValueError(f"unknown command {words[0]!r}")
            except Exception as e:  # reported to the parent, which restarts this worker
                traceback.print_exc()
                _send(reply, f"err {type(e).__name__}: {e}")
                return 1
            _send(reply, "ok")
        return 0  # the parent closed the command pipe
    except Exception as e:  # a failed start: the parent reads this line as the reason
        traceback.print_exc()
        try:
            _send(reply, f"err {type(e).__name__}: {e}")
        except OSError:
            pass
        return 1
    finally:
        for part in work or ():
            part.close()
        if block is not None:
            block.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
