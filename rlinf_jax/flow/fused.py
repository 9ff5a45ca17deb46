"""The fused runner: a chunk of iterations of any `Algorithm` in one jitted program over one
state, on the algorithm's mesh (the PureJaxRL / Brax way: no host round trip between
iterations). Env, rollout and actor are collocated; the env batch and the parameters are
laid out as the algorithm's `shardings` say, so the same program runs on 1 or N devices.

It is also the learner half other runners are built around: a staged runner places its
learner's state, evaluates and draws strips through the `Fused` of its actor mesh.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from rlinf_jax.flow.algorithm import Algorithm
from rlinf_jax.flow.trainer import EnvTrainer
from rlinf_jax.sharding import Placement
from rlinf_jax.sharding.mesh import put


class Fused(EnvTrainer):
    """``placement``: the run's layout (all collocated on the algorithm's mesh); None where
    the runner serves as another runner's learner half or as the planner's stand-in."""

    def __init__(self, algorithm: Algorithm, placement: Placement | None = None):
        self.algorithm, self.placement, self.cfg = algorithm, placement, algorithm.cfg
        # The programs the planner compiles for a target are these very jitted functions.
        self.run_chunk = jax.jit(algorithm.chunk, donate_argnums=0)
        self.evaluate = jax.jit(algorithm.evaluate)

    # What the env-stepping loop reads, the algorithm's.
    @property
    def env_steps_per_iteration(self) -> int:
        return self.algorithm.env_steps_per_iteration

    @property
    def warm_start_metrics(self) -> dict | None:
        return self.algorithm.warm_start_metrics

    @property
    def image_observations(self) -> bool:
        return self.algorithm.image_observations

    # ---------------------------------------------------------------- the state
    def place(self, state: Any) -> Any:
        return put(state, self.algorithm.shardings(state))

    def init(self) -> Any:
        return self.place(self.algorithm.fresh_state())

    def start(self, restored: Any) -> Any:
        return self.place(self.algorithm.complete(restored))

    def snapshot(self, state: Any) -> Any:
        return self.algorithm.snapshot(state)

    def progress(self, state: Any) -> tuple[int, int]:
        return int(state.step), int(state.bad_iterations)

    # ---------------------------------------------------------------- programs
    def compile(self, state: Any, eval_key: Any) -> None:
        """Compiles ahead of time so that the first chunk's timing is pure execution."""
        self._chunk = self.run_chunk.lower(state, *self.algorithm.chunk_args, jnp.int32(1)).compile()
        self.compile_eval(state, eval_key)

    def compile_eval(self, state: Any, eval_key: Any) -> None:
        self._eval = self.evaluate.lower(*self.algorithm.eval_args(state), eval_key).compile()

    def run_iterations(self, state: Any, n: int) -> tuple[Any, Any]:
        return self._chunk(state, *self.algorithm.chunk_args, jnp.int32(n))

    def run_eval(self, state: Any, key: Any) -> dict:
        return self._eval(*self.algorithm.eval_args(state), key)

    # ---------------------------------------------------------------- host side
    def summarize(self, sums: dict, n: int) -> dict[str, float]:
        return self.algorithm.summarize(sums, n)

    def strip(self, state: Any, key: Any, episodes: int) -> Any:
        return self.algorithm.strip(state, key, episodes)

    def meta(self) -> dict:
        return self.algorithm.meta()
