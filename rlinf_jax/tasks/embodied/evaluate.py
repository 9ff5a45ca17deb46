"""Scoring a saved embodied policy: the checkpoint of a run, restored onto the run's own
config, run deterministically for one episode in every eval env. Same checkpoint and
key, same numbers."""

from __future__ import annotations

from pathlib import Path

from rlinf_jax.config.schema import Config, FlowConfig
from rlinf_jax.errors import BadInput
from rlinf_jax.flow.host_loop import eval_key
from rlinf_jax.flow.seeds import SeedBatch, seed_keys, unstack
from rlinf_jax.runtime import restore_checkpoint
from rlinf_jax.runtime.media import write_png
from rlinf_jax.tasks.embodied.layouts import placed_trainer
from rlinf_jax.tasks.embodied.setup import make_setup


def restore(point, cfg: Config):
    """``(trainer, state)``: the checkpoint at ``point`` on a collocated trainer of ``cfg``
    (evaluation is one jitted loop whatever layout trained the policy)."""
    if cfg.runner.task != "embodied" and not (cfg.runner.task == "sft" and cfg.actor.model.kind == "vla"):
        raise BadInput(
            f"{point.path} is a checkpoint of a {cfg.runner.task} run of a language model; "
            "evaluate it with: python -m rlinf_jax.evaluate --checkpoint RUN_FOLDER"
        )
    cfg.cluster.component_placement = "collocated"
    cfg.flow = FlowConfig()
    # The checkpoint holds the weights: no warm start to redo.
    trainer = placed_trainer(cfg, make_setup(cfg))
    # A host simulator's trainer gives the checkpoint's layout without starting workers.
    target = getattr(trainer, "checkpoint_target", trainer.init)()
    try:
        state, _ = restore_checkpoint(point, target, keep=cfg.runner.keep_checkpoints)
    except BaseException:
        trainer.close()
        raise
    return trainer, state


def evaluate(point, cfg: Config, key=None, strip=None, strip_episodes: int = 4) -> tuple[int, dict]:
    """``(step, eval metrics)`` of the checkpoint at ``point`` (a `ResumePoint`) of a run
    with config ``cfg``, its episodes drawn from ``key`` (None: the run's own evaluation
    at that step); with ``strip``, the metrics also name a PNG of the first
    ``strip_episodes`` episodes (image envs). A checkpoint of seeds side by side gives
    each run's evaluation and their mean with its interval (`flow.seeds`)."""
    if strip is not None and Path(strip).exists():
        raise BadInput(f"--strip {strip} exists; choose a new file name")
    trainer, state = restore(point, cfg)
    try:  # a host simulator's evaluation starts worker processes
        drawer = trainer  # what draws the strip
        if isinstance(trainer, SeedBatch):
            metrics = trainer.evaluate_runs(state, trainer.eval_keys(state) if key is None else seed_keys(trainer, key))
            state, drawer = unstack(state, 0), trainer.algorithm  # the first run's strip
        else:
            key = eval_key(cfg, int(state.step)) if key is None else key
            metrics = {k: float(v) for k, v in trainer.evaluate(state.params, state.obs_stats, key).items()}
        if strip is not None:
            key = eval_key(cfg, int(state.step)) if key is None else key
            metrics["strip"] = str(save_strip(drawer, state, cfg, key, strip, strip_episodes))
    finally:
        trainer.close()
    return int(state.step), metrics


def save_strip(drawer, state, cfg, key, path, episodes: int):
    """The first ``episodes`` eval episodes, one frame per policy step, as one PNG
    (``drawer``: a runner, or a seed batch's algorithm for its first run)."""
    if not drawer.image_observations:
        raise BadInput(f"--strip needs an env with image observations; {cfg.env.suite}/{cfg.env.name} has none")
    return write_png(path, drawer.strip(state, key, episodes))
