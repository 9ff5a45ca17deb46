"""The algorithm contract: one run's learning algorithm as pure functions over its state.

An `Algorithm` is what a runner is built *over*. It holds what is static (envs, model
graph, optimisers, numbers from the config, the mesh its state is laid out on) and offers
pure functions of arrays: a state of step 0, where each leaf of a state lives, a chunk of
training iterations, an evaluation. It owns no compiled program and keeps no state between
calls; a runner decides how those functions run:

- `flow.fused.Fused` jits the chunk and the evaluation, one program each, on the
  algorithm's mesh;
- `flow.seeds.SeedBatch` vmaps the same two functions over a leading seed axis;
- `flow.staged.Staged` runs an iteration step by step on component meshes: per batched env
  step it asks `act` for actions on the rollout's devices and steps the env on the env's,
  and every `learn_every` steps it hands that `Segment` of experience to `learn` on the
  learner's (the stepwise parts below);
- `flow.host.Host` runs the same steps with the env stepped by worker processes (a host
  simulator), between `act` and `learn` calls on the host.

So an algorithm written once runs in every runner, and a runner written once takes every
algorithm. Required parts left out raise `NotImplementedError` naming the class.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rlinf_jax.sharding.mesh import fetch, replicated


class Segment(NamedTuple):
    """``learn_every`` batched env steps of experience, time-major, as a staged runner hands
    them to `Algorithm.learn`."""

    env: Any  # `rollout.Transition`: what the env gave ([L, B]; raw_action, logprob, value None)
    record: Any  # what `act` recorded beside each action ([L, B, ...])
    last_obs: Any  # the observations after the segment's last step ([B, ...])


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
    def fresh_state(self, seed: int | None = None, env_state: Any = None) -> Any:
        """A run's unplaced state of step 0 for ``seed`` (default ``runner.seed``): around
        ``env_state`` when given (a host simulator's, whose envs reset in their workers),
        else around the env's reset."""
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

    def deterministic(self, *eval_args: Any) -> Any:
        """``obs -> action``: the evaluation's policy (the mode, a greedy decode) of the
        parameters ``eval_args`` names, for runners that step the eval env themselves."""
        raise missing(self, "deterministic")

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

    def add_sums(self, totals: dict, sums: dict) -> dict:
        """Two iterations' device metrics as one chunk's (summed, unless the algorithm says
        otherwise for a level such as a buffer's size)."""
        return {k: totals[k] + sums[k] for k in totals}

    # ------------------------------------------ the steps (the staged runner's parts)
    # Batched env steps of one iteration, and how many of them each `learn` call takes: the
    # whole rollout (PPO), or one (the off-policy family learns after every env step).
    rollout_length: int
    learn_every: int
    # The JAX env batch the steps act on, and the iterations at the start of a run that
    # learn without stepping it (offline RL).
    env: Any = None
    offline_iterations: int = 0
    # The state's fields holding optimiser state: what flow.offload_optimizer parks in host
    # memory between updates.
    optimizer_fields: tuple[str, ...] = ()

    def iteration_keys(self, key: Any) -> tuple[Any, Any, Any]:
        """``(the chain's next key, the acting keys, the learning keys)`` of one iteration,
        drawn from the state's key: the same draws in every runner."""
        raise missing(self, "iteration_keys")

    def acting(self, state: Any) -> Any:
        """What the policy acts with, taken from the learner's ``state`` (parameters and
        observation statistics)."""
        raise missing(self, "acting")

    def acting_shardings(self, acting: Any, mesh: Any) -> Any:
        """Where the rollout keeps ``acting`` on its ``mesh``: replicated unless the
        algorithm lays its parameters out by rules."""
        return replicated(mesh)

    def resume_acting(self, state: Any) -> tuple[Any, int]:
        """``(what a stale rollout acts with first after a restart, how many updates it is
        behind the learner)``: by default the learner's own parameters (0 behind)."""
        return self.acting(state), 0

    def act(self, acting: Any, obs: Any, act_keys: Any, t: Any, first_env: Any, env_step: Any) -> tuple[Any, Any]:
        """Pure: ``(env actions, what to record)`` for the observations of envs ``first_env``
        onwards at step ``t`` of the iteration, the run's batched env step ``env_step``."""
        raise missing(self, "act")

    def learn(self, state: Any, segment: Segment, learn_keys: Any, k: Any, *chunk_args: Any) -> tuple[Any, dict]:
        """Pure: the learner's step on segment ``k`` of the iteration -> ``(state, metrics)``."""
        raise missing(self, "learn")

    def zero_sums(self, state: Any, segment: Any, learn_keys: Any):
        """A jitted ``() -> sums``: `learn`'s metric sums, all zero and replicated on the
        mesh, where an iteration's sums start before its first segment. The arguments are
        arrays or `jax.ShapeDtypeStruct`s; only their shapes are read (a parked optimiser
        state's memory kind is not the update's)."""
        plain = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype, weak_type=getattr(x, "weak_type", False)),
                             (state, segment, learn_keys))
        shapes = jax.eval_shape(self.learn, *plain, np.int32(0), *self.chunk_args)[1]
        return jax.jit(lambda: jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes),
                       out_shardings=replicated(self.mesh))

    def finish(self, state: Any, sums: dict, key: Any, next_acting: Any) -> tuple[Any, dict]:
        """Pure: the iteration's bookkeeping after its last `learn`: the chain's next ``key``
        into the state, and what the rollout acts with next (``next_acting``; None: the
        state's own `acting`)."""
        raise missing(self, "finish")

    def offline_iteration(self, state: Any, learn_keys: Any, *chunk_args: Any) -> tuple[Any, dict]:
        """Pure: an iteration without the env (the first `offline_iterations`)."""
        raise missing(self, "offline_iteration")

    def env_steps_taken(self, state: Any) -> int:
        """Batched env steps the run of ``state`` has taken: one rollout per iteration unless
        the algorithm counts otherwise."""
        return int(fetch(state.step)) * self.rollout_length

    def relaid(self, mesh: Any) -> Algorithm:
        """The same algorithm with its state laid out on another ``mesh`` (a dynamic update
        phase's), never evaluating there."""
        raise missing(self, "relaid")
