"""The trainer contract: what the host loop asks of every workload's trainer.

A trainer owns the compiled programs and the static parts of a run (model graph,
optimiser, envs or data); its *state* is a pytree of arrays the loop threads through
(parameters, optimiser state, step counters, env state, ...). The loop decides when to
run, evaluate, log and save; the trainer decides how.

Trainers subclass `Trainer` explicitly and inherit the defaults of the optional parts
(a state that is its own snapshot, no metadata, nothing to compile or close); a required
part left out raises `NotImplementedError` naming the class, never returns None.

`EnvTrainer` refines it for a trainer that steps environments (embodied PPO, the
off-policy family) in any layout; the env-stepping loop (`tasks/env_rl/loop.py`) reads that
and nothing else. The env-stepping trainers are runners over an `flow.algorithm.Algorithm`
(`flow.fused.Fused`, `flow.seeds.SeedBatch`, `flow.staged.Staged`, `flow.host.Host`).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from rlinf_jax.flow.algorithm import Algorithm, missing
from rlinf_jax.sharding import Placement


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

    # The algorithm it runs (`flow.algorithm`), set in the constructor; None only for a
    # trainer that runs none (a test's stand-in).
    algorithm: Algorithm | None = None
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
