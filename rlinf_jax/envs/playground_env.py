"""Adapter from a MuJoCo Playground dm_control suite env to our unbatched `EnvState`.

The suite's XML files ship inside the `playground` pip package, so this works offline.
Playground's own ``episode_length`` / ``action_repeat`` config keys are only read by its
Brax training wrappers, which we do not use: our `TimeLimit` / `ActionRepeat` do that job.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp

from rlinf_jax.envs.base import EnvState
from rlinf_jax.envs.brax_env import missing_asset_error
from rlinf_jax.errors import BadInput

# Maps to Playground's `impl` config key. Its defaults say "warp"; we default to "jax"
# (MJX in pure JAX), which jits, vmaps and shards like the rest of the program.
PLAYGROUND_BACKENDS = ("jax", "warp")


def playground_env_names() -> list[str]:
    from mujoco_playground import dm_control_suite

    return sorted(dm_control_suite.ALL_ENVS)


class PlaygroundEnv:
    """One dm_control suite env, no batch axis. `sim` is Playground's `State`.

    Playground's ``done`` is a termination (NaN physics and the like); the time limit is
    ours. A ``success`` metric, where an env has one, is exposed as ``info["success"]``.
    """

    num_envs = 1  # unbatched: leaves have no leading env axis

    def __init__(self, name: str, backend: str = "jax"):
        from mujoco_playground import dm_control_suite

        if backend not in PLAYGROUND_BACKENDS:
            raise BadInput(
                f"unknown playground backend {backend!r}; choose one of {', '.join(PLAYGROUND_BACKENDS)}"
            )
        self.name, self.backend = name, backend
        try:
            self._env = dm_control_suite.load(name, config_overrides={"impl": backend})
        except (OSError, ValueError) as exc:
            err = missing_asset_error(exc, f"playground env {name!r}")
            if err is None:
                raise
            raise err from exc
        shapes = jax.eval_shape(self._env.reset, jax.random.PRNGKey(0))
        if isinstance(shapes.obs, Mapping):
            raise BadInput(f"playground env {name!r} has dict observations, which are not supported")
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
