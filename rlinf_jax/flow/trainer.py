"""The trainer contract: what the host loop asks of every workload's trainer.

A trainer owns the compiled programs and the static parts of a run (model graph,
optimiser, envs or data); its *state* is a pytree of arrays the loop threads through
(parameters, optimiser state, step counters, env state, ...). The loop decides when to
run, evaluate, log and save; the trainer decides how.

Trainers subclass `Trainer` explicitly and inherit the defaults of the optional parts
(a state that is its own snapshot, no metadata, nothing to compile or close).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Trainer(Protocol):
    # Independent runs the trainer trains side by side (seeds, `flow.seeds`): what the
    # loops multiply a run's steps by for the machine's throughput.
    num_runs: int = 1

    def init(self) -> Any:
        """The state of step 0 (fresh parameters, or a warm start's), placed on devices."""

    def start(self, restored: Any) -> Any:
        """A state read from a checkpoint -> the running state, placed on devices."""

    def snapshot(self, state: Any) -> Any:
        """The running state -> the arrays a checkpoint holds (what `start` reads back)."""
        return state

    def progress(self, state: Any) -> tuple[int, int]:
        """``(step, consecutive iterations with a skipped non-finite update)``."""

    def compile(self, state: Any, eval_key: Any) -> None:
        """Work worth doing before the first timed chunk (ahead-of-time compiles); may be nothing."""
        return None

    def run_iterations(self, state: Any, n: int) -> tuple[Any, Any]:
        """``n`` training iterations: ``(state, metrics)``; the loop's run hook reads the metrics."""

    def run_eval(self, state: Any, key: Any) -> dict:
        """Evaluation metrics (``eval/*``) of the current policy."""

    def meta(self) -> dict:
        """JSON metadata a checkpoint carries beside the arrays (data cursor, model config)."""
        return {}

    def load_meta(self, meta: dict) -> None:
        """Takes back what `meta` wrote, on resume."""
        return None

    def close(self) -> None:
        """Releases threads and processes (reward checkers); called on every exit path."""
        return None
