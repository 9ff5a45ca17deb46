"""Adapter from a MuJoCo Playground dm_control suite env to our unbatched `EnvState`.

The suite's XML files ship inside the `playground` pip package, so this works offline.
Playground's own ``episode_length`` / ``action_repeat`` config keys are only read by its
Brax training wrappers, which we do not use: our `TimeLimit` / `ActionRepeat` do that job.
"""

from __future__ import annotations

from rlinf_jax.envs.sim_adapter import SimAdapter
from rlinf_jax.errors import BadInput

# Maps to Playground's `impl` config key. Its defaults say "warp"; we default to "jax"
# (MJX in pure JAX), which jits, vmaps and shards like the rest of the program.
PLAYGROUND_BACKENDS = ("jax", "warp")


def playground_env_names() -> list[str]:
    from mujoco_playground import dm_control_suite

    return sorted(dm_control_suite.ALL_ENVS)


class PlaygroundEnv(SimAdapter):
    """One dm_control suite env, no batch axis. `sim` is Playground's `State`.

    Playground's ``done`` is a termination (NaN physics and the like); the time limit is ours.
    """

    def __init__(self, name: str, backend: str = "jax"):
        from mujoco_playground import dm_control_suite

        if backend not in PLAYGROUND_BACKENDS:
            raise BadInput(
                f"unknown playground backend {backend!r}; choose one of {', '.join(PLAYGROUND_BACKENDS)}"
            )
        self.name, self.backend = name, backend
        self._load(
            f"playground env {name!r}",
            lambda: dm_control_suite.load(name, config_overrides={"impl": backend}),
        )
