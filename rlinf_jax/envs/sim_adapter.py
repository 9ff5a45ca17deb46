"""What every simulator adapter shares: library state in, unbatched `EnvState` out.

Brax and MuJoCo Playground states both carry ``obs``, ``reward``, ``done`` and
``metrics``; a subclass only loads its library's env (through `_load`) and names itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from rlinf_jax.envs.base import EnvState
from rlinf_jax.errors import BadInput


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


@dataclass(frozen=True)
class _Sim:
    """A loaded library env, its reset and step under jit, and what its reset's shapes say."""

    env: object
    reset: Callable
    step: Callable
    observation_size: int
    has_success: bool


# (adapter, env name, backend) -> its `_Sim`, shared by every adapter of that key in the
# process; see `_load`.
_SIMS: dict[tuple[str, str, str], _Sim] = {}


class SimAdapter:
    """One simulator env, no batch axis; `sim` is the library's own state.

    The library's ``done`` is a termination; time limits are added by `TimeLimit`. A
    ``success`` metric, where the env has one, is exposed as ``info["success"]``
    (``has_success``). A subclass sets ``name`` and ``backend`` before `_load`.
    """

    num_envs = 1  # unbatched: leaves have no leading env axis

    def _load(self, what: str, load: Callable[[], object]) -> None:
        """Loads the library's env, or takes the one an adapter of the same name and backend
        loaded before. The env is a pure function of (name, backend), and sharing it shares
        the traces of its reset and step: tracing a physics step takes seconds (in Brax it
        is most of a small run's start), and a run steps the same env in its rollout, its
        evaluation and its setup. Under jit, JAX traces each once per process and input
        shape, and inside a vmap reuses the batched program for every batch of that size.

        The observation size and whether the env reports success come from a shape trace of
        the reset (the libraries' observation_size runs a real, eager reset), which the
        reset's later traces reuse."""
        key = (type(self).__name__, self.name, self.backend)
        if key not in _SIMS:
            try:
                env = load()
            except (OSError, ValueError) as exc:
                err = missing_asset_error(exc, what)
                if err is None:
                    raise
                raise err from exc
            reset = jax.jit(env.reset)
            shapes = jax.eval_shape(reset, jax.random.PRNGKey(0))
            if isinstance(shapes.obs, Mapping):
                raise BadInput(f"{what} has dict observations, which are not supported")
            _SIMS[key] = _Sim(env, reset, jax.jit(env.step), int(shapes.obs.shape[-1]), "success" in shapes.metrics)
        sim = _SIMS[key]
        self._env, self._reset, self._step = sim.env, sim.reset, sim.step
        self.observation_size, self.has_success = sim.observation_size, sim.has_success
        self.action_size = int(self._env.action_size)

    def _wrap(self, s, info: dict) -> EnvState:
        info = dict(info)
        if self.has_success:
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
        return self._wrap(self._reset(key), {})

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        return self._wrap(self._step(state.sim, action), state.info)

    @property
    def unwrapped(self):
        return self
