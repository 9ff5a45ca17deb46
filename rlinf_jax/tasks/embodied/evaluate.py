"""Scoring a saved embodied policy: the checkpoint of a run, restored onto the run's own
config, run deterministically for one episode in every eval env. Same checkpoint and
seed, same numbers."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from rlinf_jax.config import load_config_file
from rlinf_jax.config.schema import FlowConfig
from rlinf_jax.errors import BadInput
from rlinf_jax.runtime import find_checkpoint, restore_checkpoint
from rlinf_jax.runtime.media import image_strip, write_png
from rlinf_jax.tasks.embodied.layouts import placed_trainer
from rlinf_jax.tasks.embodied.setup import make_setup


def evaluate(path, overrides=(), seed: int = 0, strip=None, strip_episodes: int = 4) -> dict:
    """The eval metrics of the checkpoint at ``path`` (a run, checkpoints or step folder);
    with ``strip``, also a PNG of the first ``strip_episodes`` episodes (image envs)."""
    point = find_checkpoint(path, "path")
    config_path = Path(point.directory).parent / "config.yaml"
    if not config_path.is_file():
        raise BadInput(f"{config_path} is missing: evaluate needs the run folder's resolved config next to checkpoints/")
    cfg = load_config_file(config_path, overrides)
    if cfg.runner.task != "embodied" and not (cfg.runner.task == "sft" and cfg.actor.model.kind == "vla"):
        raise BadInput(
            f"{point.path} is a checkpoint of a {cfg.runner.task} run of a language model; "
            "evaluate it with: python -m rlinf_jax.evaluate --checkpoint RUN_FOLDER"
        )
    # Evaluation is one jitted loop whatever layout trained the policy: run it collocated.
    cfg.cluster.component_placement = "collocated"
    cfg.flow = FlowConfig()
    if strip is not None and Path(strip).exists():
        raise BadInput(f"--strip {strip} exists; choose a new file name")
    # The checkpoint holds the weights: no warm start to redo.
    trainer = placed_trainer(cfg, make_setup(cfg))
    state, _ = restore_checkpoint(point, trainer.init(), keep=cfg.runner.keep_checkpoints)
    metrics = trainer.evaluate(state.params, state.obs_stats, jax.random.PRNGKey(seed))
    extra = {}
    if strip is not None:
        extra["strip"] = str(save_strip(trainer, state, cfg, seed, strip, strip_episodes))
    return {
        "checkpoint": str(point.path),
        "step": int(state.step),
        "env": f"{cfg.env.suite}/{cfg.env.name}",
        "episodes": cfg.env.num_eval_envs,
        "seed": seed,
        **{k: float(v) for k, v in metrics.items()},
        **extra,
    }


def save_strip(trainer, state, cfg, seed: int, path, episodes: int):
    """The first ``episodes`` eval episodes, one frame per policy step, as one PNG."""
    obs = jax.eval_shape(trainer.eval_env.reset, jax.random.PRNGKey(0)).obs
    if not isinstance(obs, dict) or "image" not in obs:
        raise BadInput(f"--strip needs an env with image observations; {cfg.env.suite}/{cfg.env.name} has none")
    substeps = max(1, trainer.substeps)
    steps = -(-cfg.env.episode_length // substeps)
    frames = trainer.episode_frames(state.params, state.obs_stats, jax.random.PRNGKey(seed), steps)
    return write_png(path, image_strip(np.asarray(frames)[:, :episodes]))


