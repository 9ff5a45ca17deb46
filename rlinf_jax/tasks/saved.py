"""Saved runs of every task that trains a policy on an env: where a checkpoint's run config
is, the policy a checkpoint holds as functions on observations, and its evaluation.

`restore_policy` is what collecting transitions (``python -m rlinf_jax.collect``) and
notebooks build on; ``python -m rlinf_jax.evaluate RUN`` calls `evaluate_run`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax

from rlinf_jax.config import load_config_file
from rlinf_jax.config.schema import Config
from rlinf_jax.errors import BadInput
from rlinf_jax.flow.seeds import SeedBatch, resolve_seeds, unstack
from rlinf_jax.runtime import find_checkpoint
from rlinf_jax.runtime.checkpoint import ResumePoint
from rlinf_jax.tasks.embodied import evaluate as embodied_eval
from rlinf_jax.tasks.offpolicy import evaluate as offpolicy_eval
from rlinf_jax.tasks.offpolicy import learner as offpolicy_lib


def run_config(path, overrides=()) -> tuple[ResumePoint, Config]:
    """The checkpoint ``path`` means (a run, checkpoints or step folder) and the config of
    its run (its ``config.yaml``, with ``overrides``)."""
    point = find_checkpoint(path, "path")
    config_path = Path(point.directory).parent / "config.yaml"
    if not config_path.is_file():
        raise BadInput(f"{config_path} is missing: a saved run needs its resolved config next to checkpoints/")
    return point, load_config_file(config_path, overrides)


@dataclass
class RestoredPolicy:
    """The policy of a checkpoint: ``act(obs)`` its evaluation action (the mode),
    ``sample(obs, per-env keys)`` an action drawn from it; both take a batch of
    observations of ``env`` and return env actions."""

    cfg: Config
    checkpoint: str
    step: int
    env: Any  # the run's batched training env
    eval_env: Any
    act: Callable
    sample: Callable

    def __call__(self, obs):
        return self.act(obs)


def first_run(trainer, state):
    """What holds the policy's functions (the trainer's algorithm; a test's stand-in trainer
    holds its own) and the state of one run: for seeds side by side the first seed's."""
    holder = trainer if trainer.algorithm is None else trainer.algorithm
    return holder, unstack(state, 0) if isinstance(trainer, SeedBatch) else state


def restore_policy(path, overrides=()) -> RestoredPolicy:
    """The policy of a checkpoint (for seeds side by side, the first seed's run)."""
    point, cfg = run_config(path, overrides)
    if cfg.runner.task == "offpolicy":
        holder, state = first_run(*offpolicy_eval.restore(point, cfg))
        act = offpolicy_lib.greedy(holder.learner, state.actor, state.obs_stats)
        sample = offpolicy_lib.acting(holder.learner, state.actor, state.obs_stats)
    else:
        holder, state = first_run(*embodied_eval.restore(point, cfg))
        act = holder.deterministic(state.params, state.obs_stats)
        acting = holder.policy_fn(state.params, state.obs_stats)
        sample = lambda obs, keys: acting(obs, keys)[0]  # noqa: E731  (the env action of (action, raw, logprob))
    return RestoredPolicy(cfg, str(point.path), int(state.step), holder.env, holder.eval_env, act, sample)


def evaluate_run(path, overrides=(), seed: int | None = None, strip=None, strip_episodes: int = 4) -> dict:
    """The evaluation of the checkpoint at ``path`` (see ``python -m rlinf_jax.evaluate``).

    With no ``seed`` its episodes are those of the run's own evaluation at the checkpoint's
    step (the key `flow.host_loop.eval_key` derives from ``runner.seed`` and the step), so
    the numbers are the ones the run logged there; a ``seed`` draws other episodes. The
    result's ``protocol`` says which."""
    point, cfg = run_config(path, overrides)
    key = None if seed is None else jax.random.PRNGKey(seed)  # None: the run's own evaluation
    if cfg.runner.task == "offpolicy":
        if strip is not None:
            raise BadInput("--strip needs an env with image observations; off-policy runs have flat ones")
        step, metrics = offpolicy_eval.evaluate(point, cfg, key)
    else:
        step, metrics = embodied_eval.evaluate(point, cfg, key, strip, strip_episodes)
    return {
        "checkpoint": str(point.path),
        "step": step,
        "env": f"{cfg.env.suite}/{cfg.env.name}",
        "episodes": cfg.env.num_eval_envs,
        "seed": seed,
        "protocol": protocol(step, seed, overrides),
        # Seeds side by side: every run's evaluation, and their mean with its interval.
        **({"runs": list(resolve_seeds(cfg.runner))} if len(resolve_seeds(cfg.runner)) > 1 else {}),
        **metrics,
    }


def protocol(step: int, seed: int | None, overrides=()) -> str:
    """Which episodes an evaluation ran, in words."""
    if seed is not None:
        return f"seed {seed}: other episodes than the run's own evaluation"
    if overrides:
        return f"the key of the run's own evaluation at step {step}, with {' '.join(overrides)}"
    return f"the run's own evaluation at step {step}"
