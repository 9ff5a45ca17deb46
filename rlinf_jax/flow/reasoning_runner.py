"""A language-model run (``runner.task`` sft or reasoning) on the shared host loop.

The loop (`flow.host_loop`: chunks ending at multiples of the log / eval / save
intervals, resume, logs, checkpoints, multi-host roles) is the embodied run's. A
checkpoint holds the trainer's arrays (policy, optimiser state, step) and, in its
metadata, the data loader's cursor and the model's architecture, so
``actor.model.path`` can point at any sft / reasoning run.

Before step 1 the held-out set is scored once (``eval/accuracy`` at step 0): the
warm start's accuracy, against which RL's gain is read.

A reasoning run without ``actor.model.path`` and with ``sft.warm_start_steps > 0`` first
runs that SFT as a run of its own in ``<run dir>/sft/`` (its own metrics and checkpoints)
and starts RL from its last checkpoint. A rerun, or a resume, finds it there and reuses it;
a warm start made with other settings is refused rather than silently reused.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from rlinf_jax.config.loader import config_to_yaml, load_config_file
from rlinf_jax.config.schema import Config
from rlinf_jax.errors import BadInput
from rlinf_jax.flow.host_loop import HostLoop, enable_compilation_cache, open_run_dir
from rlinf_jax.runtime import RunDir, list_steps
from rlinf_jax.runtime.distributed import is_primary

SFT_DIR = "sft"


@dataclass
class LMRunSummary:
    run_dir: Path
    task: str
    steps: int
    initial_accuracy: float | None  # eval/accuracy at step 0 (the warm start's)
    eval_accuracy: float | None  # at the last evaluation
    samples_per_sec: float
    wall_sec: float
    resumed_from: int | None
    warm_start: Path | None
    metric: str = "accuracy"  # what initial_accuracy / eval_accuracy measure (VLA SFT: success)


# ----------------------------------------------------------------------------- warm start


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
    # SFT has the actor alone; it runs on all the run's devices.
    c.cluster.component_placement = "collocated"
    c.cluster.mesh = {k: v for k, v in cfg.cluster.mesh.items() if k == "actor"}
    return c


def _comparable(cfg: Config) -> str:
    c = copy.deepcopy(cfg)
    c.runner.resume = "auto"
    c.runner.progress_bar = True
    return config_to_yaml(c)


def warm_start(cfg: Config, console=None) -> Path | None:
    """Runs (or finds) the SFT warm start; returns its run folder, or None when the recipe has none."""
    if cfg.runner.task != "reasoning" or cfg.actor.model.path or cfg.sft.warm_start_steps == 0:
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
        run(sft_cfg, console=console)
    return sft_dir.path


# ----------------------------------------------------------------------------- trainers


def build_trainer(cfg: Config):
    if cfg.runner.task == "sft":
        from rlinf_jax.flow.sft import SFTTrainer

        return SFTTrainer(cfg)
    from rlinf_jax.flow.reasoning import ReasoningTrainer

    return ReasoningTrainer(cfg)


def _write_placement(trainer, path: Path) -> None:
    info = trainer.placement.to_json()
    info["runner"] = type(trainer).__name__
    info["model"] = trainer.model_source
    path.write_text(json.dumps(info, indent=2) + "\n")


# ----------------------------------------------------------------------------- the loop


class LMLoop(HostLoop):
    """The host loop of an sft / reasoning run: the held-out set is scored at step 0, and
    a checkpoint's metadata carries the data cursor and the model's architecture."""

    bar_info = "evaluating..."
    shown: ClassVar[dict[str, str]] = {
        "eval/accuracy": "acc", "rollout/reward_mean": "reward", "train/loss": "loss", "time/step_sec": "s/step"
    }
    eval_metric = "eval/accuracy"
    unit = "steps"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.label = "sft" if self.cfg.runner.task == "sft" else "rl"

    def write_placement(self, path: Path, metrics: dict | None = None) -> None:
        _write_placement(self.trainer, path)

    def load_meta(self, meta: dict) -> None:
        self.trainer.load_meta(meta)

    def checkpoint_meta(self) -> dict:
        return self.trainer.meta()

    def first_record(self, state) -> dict:
        return self.evaluate(state, 0)

    def run_chunk(self, state, n: int):
        return self.trainer.run_iterations(state, n)

    def close(self) -> None:
        self.trainer.close()


def run(cfg: Config, console=None) -> LMRunSummary:
    """Trains (or resumes) the sft / reasoning run ``cfg`` describes; returns its summary."""
    t_start = time.perf_counter()
    enable_compilation_cache(cfg.runner.compilation_cache)
    run_dir, resume_path = open_run_dir(cfg)
    if cfg.runner.task == "reasoning":
        from rlinf_jax.flow.reasoning import check_algorithm

        check_algorithm(cfg)  # before a warm start spends minutes
    warm = warm_start(cfg, console)
    train_cfg = cfg
    if warm is not None:
        train_cfg = copy.deepcopy(cfg)
        train_cfg.actor.model.path = str(warm)
    trainer = build_trainer(train_cfg)
    result = LMLoop(cfg, trainer, run_dir, resume_path, console).run()

    def accuracy(record):
        return None if record is None else record.get("eval/accuracy")

    return LMRunSummary(
        run_dir=result.run_dir,
        task=cfg.runner.task,
        steps=result.step,
        initial_accuracy=accuracy(result.first),
        eval_accuracy=accuracy(result.last_eval),
        samples_per_sec=(result.step - result.start_step) * trainer.samples_per_iteration / result.train_sec
        if result.train_sec else 0.0,
        wall_sec=time.perf_counter() - t_start,
        resumed_from=result.resumed_from,
        warm_start=warm,
    )
