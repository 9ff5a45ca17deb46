"""Host-simulator suites as the embodied task sees them: the config checked, the spec the
worker pool runs, and what a policy is sized from.

``env.suite=gym``: ``env.name`` is any registered Gymnasium env id (the MuJoCo v5 family
is the reference set), stepped by C MuJoCo in the workers.

With ``env.camera`` (robosuite envs) the policy sees what a tabletop env gives a VLA:
``{"image": uint8 [B, H, W, 3], "tokens": int32 [B, L], "proprio": float32 [B, state]}``,
the image the workers render, the state vector the state-only run sees, and the task's
instruction as word ids (one fixed instruction per task, in a vocabulary of its words).
"""

from __future__ import annotations

import numbers
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlinf_jax.config.schema import EnvConfig
from rlinf_jax.envs.host.pool import HostEnvPool, HostEnvSpec, describe
from rlinf_jax.envs.install import resolve_worker_python
from rlinf_jax.errors import BadInput

HOST_SUITES = ("gym",)
RESET_MODES = ("cached", "fresh")
ROBOSUITE = "robosuite:"  # the worker's prefix of robosuite env names
LIBERO = "libero:"  # and of LIBERO's tasks (libero:<suite>/<task>)
CAMERA_SIMULATORS = (ROBOSUITE, LIBERO)
# The instruction of each robosuite task (by the name's prefix: PickPlaceCan is a
# PickPlace); any other task is named by its own words ("NutAssembly" -> "nut assembly").
INSTRUCTIONS = {
    "Lift": "lift the cube",
    "Stack": "stack the red cube on the green cube",
    "Door": "open the door",
    "PickPlace": "pick up the object and place it in its bin",
}


def instruction(env_id: str, stated: str = "") -> str:
    """The task's instruction: the one the simulator states (LIBERO's), else the table's."""
    if stated:
        return stated.lower()
    task = env_id[len(ROBOSUITE):] if env_id.startswith(ROBOSUITE) else env_id
    for prefix, text in INSTRUCTIONS.items():
        if task.startswith(prefix):
            return text
    return " ".join(re.findall(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])", task)).lower() or task.lower()


def instruction_tokens(env_id: str, stated: str = "") -> tuple[np.ndarray, int]:
    """``(word ids int32 [L], vocabulary size)``: id 0 pads (the VLA's convention), the
    instruction's distinct words take 1.. in order of first use."""
    words = instruction(env_id, stated).split()
    vocab = {w: i + 1 for i, w in enumerate(dict.fromkeys(words))}
    return np.asarray([vocab[w] for w in words], np.int32), len(vocab) + 1


def is_host_suite(env_cfg: EnvConfig) -> bool:
    return env_cfg.suite in HOST_SUITES


@dataclass(frozen=True)
class HostEnv:
    """A host env batch before any worker runs: the sizes a policy is built for."""

    spec: HostEnvSpec
    num_envs: int

    @property
    def observation_size(self) -> int:
        return self.spec.observation_size

    @property
    def camera(self) -> bool:
        return bool(self.spec.image_shape)

    @property
    def observation_shapes(self) -> dict | None:
        """A camera env's observation structure (the tabletop's), else None (flat vectors)."""
        if not self.camera:
            return None
        return {"image": tuple(self.spec.image_shape), "tokens": self.tokens.shape,
                "proprio": (self.spec.observation_size,)}

    @property
    def tokens(self) -> np.ndarray:
        return instruction_tokens(self.spec.env_id, self.spec.instruction)[0]

    @property
    def vocab_size(self) -> int:
        return instruction_tokens(self.spec.env_id, self.spec.instruction)[1]

    # One action per step (no chunks): the policy's action is [B, 1, action_size].
    chunk_length = 1

    @property
    def action_size(self) -> int:
        return self.spec.action_size

    @property
    def has_success(self) -> bool:
        """Whether the env reports success (what `envs.base.reports_success` reads)."""
        return self.spec.has_success

    def open_pool(self, num_envs: int, num_workers: int, **options) -> HostEnvPool:
        """Worker processes stepping ``num_envs`` of these envs (`HostEnvPool`'s ``options``:
        seed, groups, first env, deadlines): a runner starts them without knowing the suite."""
        return HostEnvPool(self.spec, num_envs, num_workers, **options)

    @property
    def unwrapped(self):
        return self


def _positive(value, what: str):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value <= 0:
        raise BadInput(f"env.{what} must be > 0, got {value!r}")
    return value


def _assets_dir(cfg: EnvConfig) -> str:
    """``env.assets_dir`` as an absolute folder; LIBERO's tasks need it (their package ships
    no scene assets and nothing is downloaded)."""
    value = cfg.assets_dir or ""
    if not isinstance(value, str):
        raise BadInput(f"env.assets_dir must be a folder path, got {value!r}")
    if str(cfg.name).startswith(LIBERO) and not value:
        raise BadInput(
            f"env.name={cfg.name} needs LIBERO's scene assets, which its package does not ship: set "
            "env.assets_dir to the folder holding scenes/, articulated_objects/, ... (docs/simulators.md, LIBERO)"
        )
    if not value:
        return ""
    path = Path(value).expanduser().resolve()
    if not path.is_dir():
        raise BadInput(f"env.assets_dir={value} is not a folder")
    return str(path)


def _worker_cpus(value) -> tuple:
    """``env.worker_cpus``: distinct cores of this machine (not only this process's: the
    trainer may be pinned to cores the workers are kept off)."""
    cpus = list(value or [])
    allowed = list(range(os.cpu_count() or 1))
    if any(isinstance(c, bool) or not isinstance(c, numbers.Integral) for c in cpus) or len(set(cpus)) != len(cpus):
        raise BadInput(f"env.worker_cpus must be a list of distinct core numbers, got {value!r}")
    outside = [c for c in cpus if c not in allowed]
    if outside:
        raise BadInput(f"env.worker_cpus names core {outside[0]}, which this machine does not have (cores {allowed[0]}..{allowed[-1]})")
    return tuple(int(c) for c in cpus)


def host_spec(cfg: EnvConfig) -> HostEnvSpec:
    """The worker spec of ``cfg``, with the sizes asked of the simulator (one worker).
    An unknown env id, an unstartable interpreter or bad numbers are refused in one line."""
    for key in ("num_envs", "episode_length", "action_repeat", "num_eval_envs", "num_workers"):
        value = getattr(cfg, key)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise BadInput(f"env.{key} must be an integer >= 1, got {value!r}")
    _positive(cfg.step_timeout_s, "step_timeout_s")
    _positive(cfg.worker_start_timeout_s, "worker_start_timeout_s")
    restarts = cfg.max_worker_restarts
    if isinstance(restarts, bool) or not isinstance(restarts, numbers.Integral) or restarts < 0:
        raise BadInput(f"env.max_worker_restarts must be an integer >= 0 (0 = the first worker failure stops the run), "
                       f"got {restarts!r}")
    if cfg.reset_mode not in RESET_MODES:
        raise BadInput(f"unknown env.reset_mode {cfg.reset_mode!r}; choose one of {', '.join(RESET_MODES)}")
    camera = cfg.camera
    if camera is None:
        camera = ""
    if not isinstance(camera, str) or (camera and not re.fullmatch(r"[A-Za-z0-9_]+", camera)):
        raise BadInput(f"env.camera must be a camera name (e.g. agentview) or empty, got {camera!r}")
    if camera and not str(cfg.name).startswith(CAMERA_SIMULATORS):
        raise BadInput(f"env.camera={camera} needs a robosuite or LIBERO env (env.name=robosuite:Lift, "
                       f"libero:libero_object/0, ...), got {cfg.name!r}")
    assets_dir = _assets_dir(cfg)
    if camera:
        size = cfg.image_size
        if isinstance(size, bool) or not isinstance(size, numbers.Integral) or not 8 <= size <= 1024:
            raise BadInput(f"env.image_size must be an integer in [8, 1024] px with env.camera, got {size!r}")
    spec = HostEnvSpec(
        env_id=str(cfg.name),
        episode_length=int(cfg.episode_length),
        action_repeat=int(cfg.action_repeat),
        reset_mode=cfg.reset_mode,
        python=resolve_worker_python(cfg.worker_python),
        env_kwargs=dict(cfg.gym_kwargs or {}),
        camera=camera,
        image_size=int(cfg.image_size) if camera else 0,
        assets_dir=assets_dir,
        cpus=_worker_cpus(cfg.worker_cpus),
    )
    return describe(spec, cfg.worker_start_timeout_s)
