"""The trainer contract: what the host loop asks of every workload's trainer.

A trainer owns the compiled programs and the static parts of a run (model graph,
optimiser, envs or data); its *state* is a pytree of arrays the loop threads through
(parameters, optimiser state, step counters, env state, ...). The loop decides when to
run, evaluate, log and save; the trainer decides how.

Trainers subclass `Trainer` explicitly and inherit the defaults of the optional parts
(a state that is its own snapshot, no metadata, nothing to compile or close); a required
part left out raises `NotImplementedError` naming the class, never returns None.

Two refinements, each the whole contract of the loops that use it:
- `EnvTrainer`: a trainer that steps environments (embodied PPO, the off-policy family) in
  any layout; the env-stepping loop (`tasks/env_rl/loop.py`) reads this and nothing else.
- `FusedTrainer`: an `EnvTrainer` whose chunk is one pure program, which is what
  `flow.seeds.SeedBatch` vmaps to train seeds side by side.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from rlinf_jax.sharding import Placement
from rlinf_jax.sharding.mesh import put


def missing(trainer: Any, what: str) -> NotImplementedError:
    return NotImplementedError(f"{type(trainer).__name__} does not define {what}, which its loop needs")


@runtime_checkable
class Trainer(Protocol):
    # Independent runs the trainer trains side by side (seeds, `flow.seeds`): what the
    # loops multiply a run's steps by for the machine's throughput.
    num_runs: int = 1

    def init(self) -> Any:
        """The state of step 0 (fresh parameters, or a warm start's), placed on devices."""
        raise missing(self, "init")

    def start(self, restored: Any) -> Any:
        """A state read from a checkpoint -> the running state, placed on devices."""
        raise missing(self, "start")

    def snapshot(self, state: Any) -> Any:
        """The running state -> the arrays a checkpoint holds (what `start` reads back)."""
        return state

    def progress(self, state: Any) -> tuple[int, int]:
        """``(step, consecutive iterations with a skipped non-finite update)``."""
        raise missing(self, "progress")

    def compile(self, state: Any, eval_key: Any) -> None:
        """Work worth doing before the first timed chunk (ahead-of-time compiles); may be nothing."""
        return None

    def run_iterations(self, state: Any, n: int) -> tuple[Any, Any]:
        """``n`` training iterations: ``(state, metrics)``; the loop's run hook reads the metrics."""
        raise missing(self, "run_iterations")

    def run_eval(self, state: Any, key: Any) -> dict:
        """Evaluation metrics (``eval/*``) of the current policy."""
        raise missing(self, "run_eval")

    def meta(self) -> dict:
        """JSON metadata a checkpoint carries beside the arrays (data cursor, model config)."""
        return {}

    def load_meta(self, meta: dict) -> None:
        """Takes back what `meta` wrote, on resume."""
        return None

    def close(self) -> None:
        """Releases threads and processes (reward checkers); called on every exit path."""
        return None


class EnvTrainer(Trainer):
    """A trainer that steps environments, in any layout (fused, staged, host simulator):
    everything the env-stepping loop reads of it besides `Trainer`."""

    # The layout it runs (what placement.json shows); None for a trainer serving as the core
    # of another one (a staged runner's learner half) or as the planner's stand-in.
    placement: Placement | None = None
    # Env steps of one run in one iteration (every env, every sub-step of action repeat);
    # set by each trainer (no default: a trainer without it fails at its first read).
    env_steps_per_iteration: int
    # What a warm start (cloning, critic warm-up) measured: logged at step 0 with an
    # evaluation of the warm policy, the baseline of the run's gain. None: a cold start.
    warm_start_metrics: dict | None = None
    # Whether the eval env's observations hold a camera image (what a strip can show).
    image_observations: bool = False

    def summarize(self, sums: dict, n: int) -> dict[str, float]:
        """A chunk's summed device metrics -> host floats over its ``n`` iterations (blocks
        until the chunk is done)."""
        raise missing(self, "summarize")

    def flow_stats(self) -> dict[str, float]:
        """What the layout measured beside the maths (queue waits, worker restarts)."""
        return {}

    def strip(self, state: Any, key: Any, episodes: int) -> Any:
        """The first ``episodes`` deterministic eval episodes as one ``[H, W, 3]`` uint8
        image (envs with ``image_observations`` only)."""
        raise missing(self, "strip")


class FusedTrainer(EnvTrainer):
    """The fused layout: a chunk of iterations in one jitted program over one state, on one
    mesh. This class is the layout's machinery (placing, compiling ahead of time, running
    chunks and evaluations); a subclass supplies the algorithm's pure parts, which is also
    what `flow.seeds.SeedBatch` vmaps to train seeds side by side:

    - ``chunk_fn(state, *chunk_args, n) -> (state, sums)`` and ``chunk_args``;
    - `fresh_state`, `complete`, `shardings`;
    - ``_evaluate(*eval_args(state), key) -> metrics`` and `eval_args` (the parts of the
      state a policy's evaluation reads: the planner and the staged runners call
      ``evaluate`` on those parts alone);
    - `summarize` (`EnvTrainer`).

    The subclass's ``__init__`` ends with `fuse`, which jits the programs.
    """

    mesh: Any = None
    chunk_fn: Any = None
    chunk_args: tuple = ()

    def fuse(self) -> None:
        """Jits the chunk (its state donated) and the evaluation."""
        self.run_chunk = jax.jit(self.chunk_fn, donate_argnums=0)
        self.evaluate = jax.jit(self._evaluate)

    # ---------------------------------------------------------- the algorithm's parts
    def fresh_state(self, seed: int | None = None) -> Any:
        """A run's unplaced state of step 0 for ``seed`` (default ``runner.seed``)."""
        raise missing(self, "fresh_state")

    def complete(self, restored: Any) -> Any:
        """A run's state read from a checkpoint, filled in (what `snapshot` dropped), unplaced."""
        raise missing(self, "complete")

    def shardings(self, state: Any) -> Any:
        """Where each leaf of one run's ``state`` (real or abstract) lives."""
        raise missing(self, "shardings")

    def eval_args(self, state: Any) -> tuple:
        """The parts of ``state`` the evaluation reads (parameters, observation statistics)."""
        raise missing(self, "eval_args")

    def _evaluate(self, *args: Any) -> dict:
        raise missing(self, "_evaluate")

    def eval_fn(self, state: Any, key: Any) -> dict:
        """The evaluation of a state's policy: pure, so that it can be vmapped."""
        return self._evaluate(*self.eval_args(state), key)

    # ---------------------------------------------------------- the layout's machinery
    def place(self, state: Any) -> Any:
        return put(state, self.shardings(state))

    def init(self) -> Any:
        return self.place(self.fresh_state())

    def start(self, restored: Any) -> Any:
        return self.place(self.complete(restored))

    def progress(self, state: Any) -> tuple[int, int]:
        return int(state.step), int(state.bad_iterations)

    def compile(self, state: Any, eval_key: Any) -> None:
        """Compiles ahead of time so that the first chunk's timing is pure execution."""
        self._chunk = self.run_chunk.lower(state, *self.chunk_args, jnp.int32(1)).compile()
        self.compile_eval(state, eval_key)

    def compile_eval(self, state: Any, eval_key: Any) -> None:
        self._eval = self.evaluate.lower(*self.eval_args(state), eval_key).compile()

    def run_iterations(self, state: Any, n: int) -> tuple[Any, Any]:
        return self._chunk(state, *self.chunk_args, jnp.int32(n))

    def run_eval(self, state: Any, key: Any) -> dict:
        return self._eval(*self.eval_args(state), key)
