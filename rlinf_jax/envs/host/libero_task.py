"""A LIBERO task as the env workers step it: ``env.name=libero:<suite>/<task>``.

Like ``worker.py`` this file runs inside the worker's interpreter (LIBERO's own worker
environment, ``python -m rlinf_jax.envs.install libero``): it imports only the standard
library, numpy and the simulator.

- ``<suite>`` is one of LIBERO's task suites (``libero_spatial``, ``libero_object``,
  ``libero_goal``, ``libero_10``, ``libero_90``) and ``<task>`` the task's index in the
  benchmark's order or its name (the ``.bddl`` file's stem).
- LIBERO's package ships the task files and initial states but not the scene assets
  (meshes, textures; upstream fetches them from a model hub at first use). They come from
  ``env.assets_dir``, the folder holding ``scenes/``, ``articulated_objects/``, ...; nothing
  is downloaded. A missing asset is refused in one line naming the file.
- LIBERO asks on first import where to keep its datasets (``input()``) unless
  ``$LIBERO_CONFIG_PATH/config.yaml`` exists: the worker writes that config into a fresh
  temporary folder first (removed at exit), so no prompt and no file outside it.
- Resets start from one of the benchmark's fixed initial states (50 per task, the ones
  LIBERO's evaluations use), the one the reset seed picks; ``init_states: false`` in
  ``env.gym_kwargs`` places the objects by the task's own randomised regions instead.
  The states are numpy arrays saved by ``torch.save``; they are read without torch, by an
  unpickler that admits numpy arrays only.
- The observation is the flat state (``object-state`` then ``robot0_proprio-state``);
  with ``env.camera`` (``agentview`` or ``robot0_eye_in_hand``) also that camera's image.
  Reward is LIBERO's own (1 when the task's goal predicate holds); reaching the goal ends
  the episode as a termination, and our time limit ends it as a truncation.
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import io
import os
import pickle
import shutil
import tempfile
import zipfile

import numpy as np

PREFIX = "libero:"
SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")
# One file each of LIBERO's asset folders: a folder that lacks them is not the assets folder.
MARKERS = ("scenes", "articulated_objects", "stable_hope_objects", "turbosquid_objects", "textures")


def package_root() -> str:
    """The ``libero/libero`` folder of the installed package (found without importing it:
    the import itself wants the config written first)."""
    spec = importlib.util.find_spec("libero")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("No module named 'libero'")
    return os.path.join(list(spec.submodule_search_locations)[0], "libero")


def task_names(root: str, suite: str) -> list[str]:
    """The suite's tasks in the benchmark's order (its task map, read as a file: importing
    ``libero.libero.benchmark`` would import torch)."""
    path = os.path.join(root, "benchmark", "libero_suite_task_map.py")
    spec = importlib.util.spec_from_file_location("_libero_task_map", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.libero_task_map[suite])


def resolve(env_id: str, root: str) -> tuple[str, str]:
    """``libero:<suite>/<task>`` -> ``(suite, task name)``; a one-line error otherwise."""
    body = env_id[len(PREFIX):]
    suite, _, task = body.partition("/")
    if suite not in SUITES or not task:
        raise ValueError(f"LIBERO env names are libero:<suite>/<task index or name> with a suite of "
                         f"{', '.join(SUITES)}; got {env_id!r}")
    names = task_names(root, suite)
    if task.isdigit():
        if int(task) >= len(names):
            raise ValueError(f"{suite} has tasks 0..{len(names) - 1}, not {task}")
        return suite, names[int(task)]
    if task not in names:
        raise ValueError(f"{suite} has no task {task!r}; its tasks are 0..{len(names) - 1}: {', '.join(names[:3])}, ...")
    return suite, task


def check_assets(assets_dir: str) -> str:
    if not assets_dir:
        raise FileNotFoundError(
            "LIBERO's scene assets are not part of its package: set env.assets_dir to the folder holding "
            "scenes/, articulated_objects/, ... (LIBERO's libero/libero/assets)"
        )
    path = os.path.abspath(os.path.expanduser(assets_dir))
    missing = [m for m in MARKERS if not os.path.isdir(os.path.join(path, m))]
    if missing:
        raise FileNotFoundError(f"env.assets_dir={assets_dir} is not LIBERO's assets folder: it has no {missing[0]}/")
    return path


class _ArraysOnly(pickle.Unpickler):
    """Admits exactly what a pickled numpy array needs."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"an initial-state file may hold numpy arrays only, not {module}.{name}")
        if module == "numpy.core.multiarray":  # numpy 2 moved it; the old name still pickles
            module = "numpy._core.multiarray" if hasattr(np, "_core") else module
        return super().find_class(module, name)


def read_init_states(path: str) -> np.ndarray:
    """The ``[n, state]`` float64 initial states of a ``.pruned_init`` file (a torch.save
    zip whose pickle holds one numpy array)."""
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith("data.pkl"))
        states = _ArraysOnly(io.BytesIO(z.read(name))).load()
    states = np.asarray(states, np.float64)
    if states.ndim != 2 or not len(states):
        raise ValueError(f"{path} holds an array of shape {states.shape}, not [n, state]")
    return states


def libero_env(env_id: str, kwargs: dict, max_base_steps: int, camera: str = "", image_size: int = 0,
               assets_dir: str = ""):
    """The Gymnasium env of the task ``env_id`` (see the module's description)."""
    root = package_root()
    suite, task = resolve(env_id, root)
    assets = check_assets(assets_dir)
    kwargs = dict(kwargs)
    use_init_states = bool(kwargs.pop("init_states", True))
    if isinstance(kwargs.get("robots"), str):  # robosuite takes a name; LIBERO's tasks want a list
        kwargs["robots"] = [kwargs["robots"]]
    if camera:
        os.environ.setdefault("MUJOCO_GL", "egl")  # read at mujoco's import, as for robosuite
    _configure(root, assets)
    from libero.libero.envs.env_wrapper import ControlEnv

    settings = {"has_renderer": False, "has_offscreen_renderer": False, "use_camera_obs": False,
                "control_freq": 20, **kwargs}
    if camera:
        settings.update(has_offscreen_renderer=True, use_camera_obs=True, camera_names=[camera],
                        camera_heights=image_size, camera_widths=image_size)
    # Our time limit ends episodes (a truncation); LIBERO's horizon would raise instead.
    settings.update(ignore_done=True, horizon=max_base_steps + 1)
    bddl = os.path.join(root, "bddl_files", suite, task + ".bddl")
    try:
        control = ControlEnv(bddl_file_name=bddl, **settings)
    except (OSError, ValueError) as e:
        missing = _missing_asset(str(e), assets)
        if missing:
            raise FileNotFoundError(f"the LIBERO asset {missing} is missing from env.assets_dir={assets_dir}") from None
        raise
    init_states = None
    if use_init_states:
        init_states = read_init_states(os.path.join(root, "init_files", suite, task + ".pruned_init"))
    return _task_class()(control, camera, init_states, " ".join(task.split("_")).lower())


_CONFIG_DIR = []  # this process's LIBERO config folder, made once


def _configure(root: str, assets: str) -> None:
    """Writes LIBERO's config into a fresh temporary folder (removed when the process
    exits) and points LIBERO at it and at ``assets``, before LIBERO is first imported."""
    if not _CONFIG_DIR:
        import yaml  # LIBERO's own dependency: it reads this file with it

        config_dir = tempfile.mkdtemp(prefix="libero-config-")
        atexit.register(shutil.rmtree, config_dir, True)
        with open(os.path.join(config_dir, "config.yaml"), "w") as f:
            yaml.safe_dump({"benchmark_root": root, "bddl_files": os.path.join(root, "bddl_files"),
                            "init_states": os.path.join(root, "init_files"),
                            "datasets": os.path.join(config_dir, "datasets"), "assets": assets}, f)
        os.environ["LIBERO_CONFIG_PATH"] = config_dir
        _CONFIG_DIR.append(config_dir)
    import libero.libero as libero_paths

    # Where LIBERO looks for assets before it would reach for the hub.
    libero_paths._assets_path_cache = assets


def _missing_asset(message: str, assets: str) -> str:
    """The asset file named by a failed build's message, when it is under ``assets`` and absent."""
    for word in message.replace("'", " ").replace('"', " ").split():
        if word.startswith(assets) and not os.path.exists(word):
            return os.path.relpath(word, assets)
    return ""


@functools.cache
def _task_class():
    """The env class, made once per process (gymnasium is imported in the worker only)."""
    import gymnasium as gym
    from gymnasium import spaces

    class Task(gym.Env):
        """``ControlEnv`` with Gymnasium's interface, seeded resets and ``info["success"]``."""

        def __init__(self, control, camera: str, init_states, instruction: str):
            self.control, self.camera, self.init_states = control, camera, init_states
            self.instruction = instruction
            env = control.env
            low, high = env.action_spec
            self.action_space = spaces.Box(np.asarray(low, np.float32), np.asarray(high, np.float32))
            obs = env.reset() if init_states is None else control.set_init_state(init_states[0])
            self._keys = ["object-state", *(f"robot{i}_proprio-state" for i in range(len(env.robots)))]
            size = sum(int(np.asarray(obs[k]).size) for k in self._keys)
            state = spaces.Box(-np.inf, np.inf, (size,), np.float32)
            if camera:
                shape = np.asarray(obs[f"{camera}_image"]).shape
                self.observation_space = spaces.Dict({"state": state, "image": spaces.Box(0, 255, shape, np.uint8)})
            else:
                self.observation_space = state

        def _obs(self, obs):
            state = np.concatenate([np.asarray(obs[k], np.float32).ravel() for k in self._keys])
            if not self.camera:
                return state
            # Rendered OpenGL's way, bottom row first: flipped to the image's rows.
            return {"state": state, "image": np.ascontiguousarray(obs[f"{self.camera}_image"][::-1])}

        def reset(self, *, seed=None, options=None):
            if seed is not None:
                # robosuite 1.4's placement samplers (LIBERO's) draw from numpy's global state.
                np.random.seed(seed % 2**32)
            obs = self.control.reset()
            if self.init_states is not None:
                index = 0 if seed is None else seed % len(self.init_states)
                obs = self.control.set_init_state(self.init_states[index])
            return self._obs(obs), {"success": bool(self.control.check_success())}

        def step(self, action):
            # LIBERO's done is its goal predicate (ignore_done: never its horizon): the success.
            obs, reward, done, info = self.control.step(np.asarray(action, np.float64))
            return self._obs(obs), float(reward), bool(done), False, {**info, "success": bool(done)}

        def close(self):
            control, self.control = self.control, None
            if control is not None:
                control.close()

    return Task
