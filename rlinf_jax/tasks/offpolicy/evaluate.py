"""Scoring a saved off-policy actor: the checkpoint restored onto the run's own config, its
deterministic policy run for one episode in every eval env. Same checkpoint and key,
same numbers."""

from __future__ import annotations

from rlinf_jax.config.schema import Config
from rlinf_jax.flow.host_loop import eval_key
from rlinf_jax.flow.seeds import SeedBatch, seed_keys
from rlinf_jax.runtime import restore_checkpoint
from rlinf_jax.tasks.offpolicy.run import build_trainer


def restore(point, cfg: Config):
    """``(trainer, state)``: the checkpoint at ``point`` on a collocated trainer of ``cfg``
    (on a host simulator the checkpoint's arrays, no worker started; the caller closes the
    trainer, which evaluation's pools need)."""
    cfg.cluster.component_placement = "collocated"
    trainer = build_trainer(cfg)
    host = hasattr(trainer, "checkpoint_target")  # a host simulator's trainer gives the layout without workers
    try:
        target = trainer.checkpoint_target() if host else trainer.snapshot(trainer.init())
        state, _ = restore_checkpoint(point, target, keep=cfg.runner.keep_checkpoints)
    except BaseException:
        trainer.close()
        raise
    return trainer, state if host else trainer.start(state)


def evaluate(point, cfg: Config, key=None) -> tuple[int, dict]:
    """``(step, eval metrics)`` of the checkpoint at ``point`` of a run with config ``cfg``,
    its episodes drawn from ``key`` (None: the run's own evaluation at that step); for
    seeds side by side each run's and their mean with its interval (`flow.seeds`)."""
    trainer, state = restore(point, cfg)
    try:
        if isinstance(trainer, SeedBatch):
            metrics = trainer.evaluate_runs(state, trainer.eval_keys(state) if key is None else seed_keys(trainer, key))
            return int(state.step[0]), metrics
        key = eval_key(cfg, int(state.step)) if key is None else key
        metrics = trainer.evaluate(state.actor, state.obs_stats, key)
    finally:
        trainer.close()
    return int(state.step), {k: float(v) for k, v in metrics.items()}
