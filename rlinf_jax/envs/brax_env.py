"""Adapter from a built-in Brax env to our single-env (unbatched) `EnvState` interface."""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import jax
import jax.numpy as jnp

from rlinf_jax.envs.base import EnvState
from rlinf_jax.errors import BadInput

BRAX_BACKENDS = ("mjx", "generalized", "positional", "spring")


def missing_asset_error(exc: Exception, what: str) -> BadInput | None:
    """A BadInput for a load failure caused by a missing model file, else None.

    MuJoCo reports a missing XML/mesh as a ValueError ("Error opening file ..."), Python
    file reads as OSError; anything else is a real bug and must propagate unchanged.
    """
    msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, OSError):
        path = getattr(exc, "filename", None) or msg
        return BadInput(f"{what}: asset file missing: {path} (reinstall the package that ships it)")
    if isinstance(exc, ValueError) and any(
        s in str(exc) for s in ("Error opening file", "resource not found", "No such file")
    ):
        return BadInput(f"{what}: asset file missing: {msg} (reinstall the package that ships it)")
    return None


class BraxEnv:
    """One Brax env, no batch axis. `sim` is the Brax `State` (pipeline state, metrics, info).

    Brax's `done` is a termination; time limits are added by `TimeLimit`. When the env
    reports a `success` metric it is exposed as ``info["success"]`` for `EpisodeStats`.
    """

    num_envs = 1  # unbatched: leaves have no leading env axis

    def __init__(self, name: str, backend: str = "positional"):
        from brax import envs as brax_envs

        if backend not in BRAX_BACKENDS:
            raise BadInput(f"unknown brax backend {backend!r}; choose one of {', '.join(BRAX_BACKENDS)}")
        self.name, self.backend = name, backend
        try:
            with warnings.catch_warnings():
                # Brax warns on every construction that it is unmaintained; noise for us.
                warnings.filterwarnings("ignore", message="Brax System", category=UserWarning)
                self._env = brax_envs.get_environment(name, backend=backend)
        except (OSError, ValueError) as exc:
            err = missing_asset_error(exc, f"brax env {name!r}")
            if err is None:
                raise
            raise err from exc
        # Brax's own observation_size runs a real (eager) reset; a shape trace is enough.
        shapes = jax.eval_shape(self._env.reset, jax.random.PRNGKey(0))
        if isinstance(shapes.obs, Mapping):
            raise BadInput(f"brax env {name!r} has dict observations, which are not supported")
        self.observation_size = int(shapes.obs.shape[-1])
        self.action_size = int(self._env.action_size)
        self._has_success = "success" in shapes.metrics

    def _wrap(self, s, info: dict) -> EnvState:
        info = dict(info)
        if self._has_success:
            info["success"] = jnp.asarray(s.metrics["success"], jnp.float32)
        return EnvState(
            obs=jnp.asarray(s.obs, jnp.float32),
            reward=jnp.asarray(s.reward, jnp.float32),
            done=jnp.asarray(s.done, jnp.float32),
            truncated=jnp.zeros((), jnp.float32),
            info=info,
            sim=s,
        )

    def reset(self, key: jax.Array) -> EnvState:
        return self._wrap(self._env.reset(key), {})

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        return self._wrap(self._env.step(state.sim, action), state.info)

    @property
    def unwrapped(self):
        return self
