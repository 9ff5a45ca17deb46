"""The algorithm contract: one run's learning algorithm as pure functions over its state.

An `Algorithm` is what a runner is built *over*. It holds what is static (envs, model
graph, optimisers, numbers from the config, the mesh its state is laid out on) and offers
pure functions of arrays: a state of step 0, where each leaf of a state lives, a chunk of
training iterations, an evaluation. It owns no compiled program and keeps no state between
calls; a runner decides how those functions run:

- `flow.fused.Fused` jits the chunk and the evaluation, one program each, on the
  algorithm's mesh;
- `flow.seeds.SeedBatch` vmaps the same two functions over a leading seed axis;
- the staged and host runners of a task call the algorithm's finer pieces (acting, one
  update) stage by stage, and its state layout and evaluation as they are.

So an algorithm written once runs in every runner, and a runner written once takes every
algorithm. Required parts left out raise `NotImplementedError` naming the class.
"""

from __future__ import annotations

from typing import Any


def missing(obj: Any, what: str) -> NotImplementedError:
    return NotImplementedError(f"{type(obj).__name__} does not define {what}, which its runner or loop needs")


class Algorithm:
    """One run's algorithm on one mesh (see the module's docstring).

    Pure functions (a runner jits or vmaps them; they read no attribute that changes):
    ``chunk(state, *chunk_args, n) -> (state, sums)`` and ``evaluate(*eval_args(state), key)
    -> metrics``. The rest is host-side bookkeeping around them.
    """

    # The run's config, and the mesh the state's leaves are laid out on (`shardings`).
    cfg: Any = None
    mesh: Any = None
    # Fixed arrays every chunk reads besides the state (RLPD's demonstrations): arguments,
    # not constants, so that the program does not embed them.
    chunk_args: tuple = ()
    # Env steps of one run in one iteration (every env, every sub-step of action repeat).
    env_steps_per_iteration: int
    # What a warm start (cloning, critic warm-up) measured, logged at step 0 as the run's
    # baseline; None for a cold start.
    warm_start_metrics: dict | None = None

    # Set by `freeze` at the end of a subclass's constructor: from then on an attribute
    # cannot be assigned, so a jitted program never reads a value that changed after it was
    # traced, and no runner patches an algorithm after building it.
    _frozen: bool = False

    def freeze(self) -> None:
        object.__setattr__(self, "_frozen", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if self._frozen:
            raise AttributeError(f"{type(self).__name__} is frozen once built; cannot set {name}")
        object.__setattr__(self, name, value)

    # ------------------------------------------------------------------ the state
    def fresh_state(self, seed: int | None = None) -> Any:
        """A run's unplaced state of step 0 for ``seed`` (default ``runner.seed``)."""
        raise missing(self, "fresh_state")

    def complete(self, restored: Any) -> Any:
        """A state read from a checkpoint, filled in (what `snapshot` dropped), unplaced."""
        raise missing(self, "complete")

    def snapshot(self, state: Any) -> Any:
        """The arrays a checkpoint holds of ``state`` (fields dropped, never changed)."""
        return state

    def shardings(self, state: Any) -> Any:
        """Where each leaf of one run's ``state`` (real or abstract) lives on `mesh`."""
        raise missing(self, "shardings")

    # -------------------------------------------------------------- pure programs
    def chunk(self, state: Any, *args: Any) -> tuple[Any, dict]:
        """``chunk(state, *chunk_args, n)``: ``n`` training iterations ->
        ``(state, summed device metrics)``."""
        raise missing(self, "chunk")

    def eval_args(self, state: Any) -> tuple:
        """The parts of ``state`` the evaluation reads (parameters, observation statistics):
        what a staged runner's learner half holds is enough to evaluate."""
        raise missing(self, "eval_args")

    def evaluate(self, *args: Any) -> dict:
        """``evaluate(*eval_args(state), key)``: evaluation metrics (``eval/*``)."""
        raise missing(self, "evaluate")

    # ------------------------------------------------------------------ host side
    def summarize(self, sums: dict, n: int) -> dict[str, float]:
        """A chunk's summed device metrics -> host floats over its ``n`` iterations."""
        raise missing(self, "summarize")

    @property
    def image_observations(self) -> bool:
        """Whether the eval env's observations hold a camera image (what a strip can show)."""
        return False

    def strip(self, state: Any, key: Any, episodes: int) -> Any:
        """The first ``episodes`` deterministic eval episodes as one ``[H, W, 3]`` uint8 image."""
        raise missing(self, "strip")

    def meta(self) -> dict:
        """JSON metadata a checkpoint carries beside the arrays."""
        return {}
