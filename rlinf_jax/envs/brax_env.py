"""Adapter from a built-in Brax env to our single-env (unbatched) `EnvState` interface."""

from __future__ import annotations

import warnings

from rlinf_jax.envs.sim_adapter import SimAdapter
from rlinf_jax.errors import BadInput


BRAX_BACKENDS = ("mjx", "generalized", "positional", "spring")


class BraxEnv(SimAdapter):
    """One Brax env, no batch axis. `sim` is the Brax `State` (pipeline state, metrics, info)."""

    def __init__(self, name: str, backend: str = "positional"):
        from brax import envs as brax_envs

        if backend not in BRAX_BACKENDS:
            raise BadInput(f"unknown brax backend {backend!r}; choose one of {', '.join(BRAX_BACKENDS)}")
        self.name, self.backend = name, backend

        def load():
            with warnings.catch_warnings():
                # Brax warns on every construction that it is unmaintained; noise for us.
                warnings.filterwarnings("ignore", message="Brax System", category=UserWarning)
                return brax_envs.get_environment(name, backend=backend)

        self._load(f"brax env {name!r}", load)
