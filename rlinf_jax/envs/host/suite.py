"""Host-simulator suites as the embodied task sees them: the config checked, the spec the
worker pool runs, and what a policy is sized from.

``env.suite=gym``: ``env.name`` is any registered Gymnasium env id (the MuJoCo v5 family
is the reference set), stepped by C MuJoCo in the workers.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from rlinf_jax.config.schema import EnvConfig
from rlinf_jax.envs.host.pool import HostEnvSpec, describe
from rlinf_jax.envs.install import resolve_worker_python
from rlinf_jax.errors import BadInput

HOST_SUITES = ("gym",)
RESET_MODES = ("cached", "fresh")


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
    def action_size(self) -> int:
        return self.spec.action_size

    @property
    def unwrapped(self):
        return self


def _positive(value, what: str):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value <= 0:
        raise BadInput(f"env.{what} must be > 0, got {value!r}")
    return value


def host_spec(cfg: EnvConfig) -> HostEnvSpec:
    """The worker spec of ``cfg``, with the sizes asked of the simulator (one worker).
    An unknown env id, an unstartable interpreter or bad numbers are refused in one line."""
    for key in ("num_envs", "episode_length", "action_repeat", "num_eval_envs", "num_workers"):
        value = getattr(cfg, key)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise BadInput(f"env.{key} must be an integer >= 1, got {value!r}")
    _positive(cfg.step_timeout_s, "step_timeout_s")
    if cfg.reset_mode not in RESET_MODES:
        raise BadInput(f"unknown env.reset_mode {cfg.reset_mode!r}; choose one of {', '.join(RESET_MODES)}")
    spec = HostEnvSpec(
        env_id=str(cfg.name),
        episode_length=int(cfg.episode_length),
        action_repeat=int(cfg.action_repeat),
        reset_mode=cfg.reset_mode,
        python=resolve_worker_python(cfg.worker_python),
        env_kwargs=dict(cfg.gym_kwargs or {}),
    )
    return describe(spec)
