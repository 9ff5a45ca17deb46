"""Scoring a saved off-policy actor: the checkpoint restored onto the run's own config, its
deterministic policy run for one episode in every eval env. Same checkpoint and seed,
same numbers."""

from __future__ import annotations

import jax

from rlinf_jax.config.schema import Config
from rlinf_jax.runtime import restore_checkpoint
from rlinf_jax.tasks.offpolicy.run import build_trainer


def restore(point, cfg: Config):
    """``(trainer, state)``: the checkpoint at ``point`` on a collocated trainer of ``cfg``."""
    cfg.cluster.component_placement = "collocated"
    trainer = build_trainer(cfg)
    state, _ = restore_checkpoint(point, trainer.snapshot(trainer.init()), keep=cfg.runner.keep_checkpoints)
    return trainer, trainer.start(state)


def evaluate(point, cfg: Config, seed: int = 0) -> tuple[int, dict]:
    """``(step, eval metrics)`` of the checkpoint at ``point`` of a run with config ``cfg``."""
    trainer, state = restore(point, cfg)
    metrics = trainer.evaluate(state.actor, state.obs_stats, jax.random.PRNGKey(seed))
    return int(state.step), {k: float(v) for k, v in metrics.items()}
