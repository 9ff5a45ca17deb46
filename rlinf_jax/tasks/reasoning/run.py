"""A reasoning run: an SFT warm start when the recipe has one, then RL on the shared host loop.

A reasoning run without ``actor.model.path`` and with ``sft.warm_start_steps > 0`` first
runs that SFT as a run of its own in ``<run dir>/sft/`` (its own metrics and checkpoints)
and starts RL from its last checkpoint. A rerun, or a resume, finds it there and reuses it;
a warm start made with other settings is refused rather than silently reused.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

from rlinf_jax.config.loader import config_to_yaml, load_config_file
from rlinf_jax.config.schema import Config
from rlinf_jax.errors import BadInput
from rlinf_jax.flow.host_loop import NothingToDo, enable_compilation_cache, open_run_dir
from rlinf_jax.flow.plan import check_before_first_step
from rlinf_jax.runtime import RunDir, list_steps
from rlinf_jax.runtime.distributed import is_primary
from rlinf_jax.tasks.reasoning.config import check_algorithm
from rlinf_jax.tasks.reasoning.plan import programs
from rlinf_jax.tasks.reasoning.trainer import ReasoningTrainer
from rlinf_jax.tasks.sft.lm_model import check_resume_layout
from rlinf_jax.tasks.sft.loop import LMLoop, LMRunSummary
from rlinf_jax.tasks.sft.run import run_lm as run_sft

SFT_DIR = "sft"


def sft_warm_start_config(cfg: Config) -> Config:
    """The SFT run a reasoning recipe's ``sft:`` section describes (in ``<run dir>/sft``)."""
    c = copy.deepcopy(cfg)
    s = cfg.sft
    c.runner.task = "sft"
    c.runner.experiment_name = f"{cfg.runner.experiment_name}/{SFT_DIR}"
    c.runner.max_steps = s.warm_start_steps
    c.runner.eval_interval = 0  # final evaluation only; RL scores the warm start again at its step 0
    c.runner.save_interval = 0
    c.runner.resume = "auto"
    c.actor.optim.lr = s.lr
    c.actor.optim.lr_schedule = "constant"
    c.actor.optim.warmup_steps = 0
    c.actor.global_batch_size = s.batch_size
    c.actor.micro_batch_size = s.batch_size if s.batch_size % cfg.actor.micro_batch_size else cfg.actor.micro_batch_size
    if s.train_levels:
        c.data.train_levels = list(s.train_levels)
    # SFT has the actor alone; it runs on all the run's devices, with none to lend.
    c.cluster.component_placement = "collocated"
    c.cluster.scaling = "static"
    c.cluster.mesh = {k: v for k, v in cfg.cluster.mesh.items() if k == "actor"}
    return c


def _comparable(cfg: Config) -> str:
    c = copy.deepcopy(cfg)
    c.runner.resume = "auto"
    c.runner.progress_bar = True
    return config_to_yaml(c)


def warm_start(cfg: Config, console=None) -> Path | None:
    """Runs (or finds) the SFT warm start; returns its run folder, or None when the recipe has none."""
    if cfg.actor.model.path or cfg.sft.warm_start_steps == 0:
        return None
    sft_cfg = sft_warm_start_config(cfg)
    sft_dir = RunDir.from_config(sft_cfg)
    if sft_dir.config_yaml.is_file():
        before = load_config_file(sft_dir.config_yaml)
        if _comparable(before) != _comparable(sft_cfg):
            raise BadInput(
                f"{sft_dir.path} holds a warm start made with other settings; delete that folder to redo it, "
                "or choose another runner.experiment_name"
            )
    if sft_cfg.runner.max_steps not in list_steps(sft_dir.checkpoints):
        if console is not None and cfg.runner.progress_bar and is_primary():
            console.print(f"[bold]warm start[/bold]: {cfg.sft.warm_start_steps} SFT steps in {sft_dir.path}")
        run_sft(sft_cfg, console=console)
    return sft_dir.path


def run(cfg: Config, console=None) -> LMRunSummary | NothingToDo:
    """Trains (or resumes) the reasoning run ``cfg`` describes; returns its summary."""
    t_start = time.perf_counter()
    enable_compilation_cache(cfg.runner.compilation_cache)
    with open_run_dir(cfg) as opened:
        if opened.done is not None:
            return opened.done
        run_dir, resume_path = opened.run_dir, opened.resume_path
        check_algorithm(cfg)  # before a warm start spends minutes
        check_resume_layout(cfg, resume_path)
        check_before_first_step(cfg, lambda d: programs(cfg, d, twins=False), console)
        warm = warm_start(cfg, console)
        train_cfg = cfg
        if warm is not None:
            train_cfg = copy.deepcopy(cfg)
            train_cfg.actor.model.path = str(warm)
        trainer = ReasoningTrainer(train_cfg)
        result = LMLoop(cfg, trainer, run_dir, resume_path, console).run()
        return LMRunSummary.of(result, "reasoning", trainer.samples_per_iteration, time.perf_counter() - t_start, warm)
