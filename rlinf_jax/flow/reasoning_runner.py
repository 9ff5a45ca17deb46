"""The host loop of a language-model run (``runner.task`` sft or reasoning).

Same shape as the embodied loop: the trainer runs chunks of iterations that end at
multiples of the log / eval / save intervals counted from step 0, so a killed-and-resumed
run ends with the same numbers as an uninterrupted one. A checkpoint holds the trainer's
arrays (policy, optimiser state, step) and, in its metadata, the data loader's cursor and
the model's architecture, so ``actor.model.path`` can point at any sft / reasoning run.

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

import jax

from rlinf_jax.config.loader import config_to_yaml, load_config_file
from rlinf_jax.config.schema import Config
from rlinf_jax.errors import BadInput
from rlinf_jax.flow.embodied_runner import (
    TrainingDiverged,
    enable_compilation_cache,
    next_boundary,
)
from rlinf_jax.runtime import (
    Checkpointer,
    MetricsLogger,
    RunDir,
    list_steps,
    resolve_resume,
)
from rlinf_jax.runtime.distributed import is_multiprocess, is_primary
from rlinf_jax.sharding.mesh import fetch

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


def _due(step: int, interval: int, final: bool) -> bool:
    return final or (interval > 0 and step % interval == 0)


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


def _checkpoint_state(trainer, state):
    snapshot = trainer.snapshot(state)
    return snapshot if is_multiprocess() else jax.device_get(snapshot)


class _Bar:
    """A rich progress bar over steps with the LM headline metrics."""

    SHOWN: ClassVar[dict[str, str]] = {"eval/accuracy": "acc", "rollout/reward_mean": "reward", "train/loss": "loss", "time/step_sec": "s/step"}

    def __init__(self, total: int, start: int, enabled: bool, console, label: str):
        self.progress = None
        self.fields: dict[str, str] = {}
        if enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.progress = Progress(
                TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TimeRemainingColumn(), TextColumn("{task.fields[info]}"), console=console,
            )
            self.task = self.progress.add_task(label, total=total, completed=start, info="evaluating...")

    def __enter__(self):
        if self.progress is not None:
            self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        if self.progress is not None:
            self.progress.__exit__(*exc)

    def update(self, step: int, metrics: dict) -> None:
        if self.progress is None:
            return
        for key, label in self.SHOWN.items():
            if key in metrics:
                self.fields[label] = f"{metrics[key]:.3g}"
        self.progress.update(self.task, completed=step, info="  ".join(f"{k} {v}" for k, v in self.fields.items()))


# ----------------------------------------------------------------------------- the loop


def run(cfg: Config, console=None) -> LMRunSummary:
    """Trains (or resumes) the sft / reasoning run ``cfg`` describes; returns its summary."""
    t_start = time.perf_counter()
    enable_compilation_cache(cfg.runner.compilation_cache)
    primary = is_primary()
    run_dir = RunDir.from_config(cfg)
    resume_path = resolve_resume(cfg, run_dir)
    if resume_path is None and cfg.runner.resume == "none" and run_dir.has_checkpoints():
        raise BadInput(
            f"{run_dir.path} already holds checkpoints; pass runner.resume=auto to continue that run "
            "or choose another runner.experiment_name"
        )
    if cfg.runner.task == "reasoning":
        from rlinf_jax.flow.reasoning import check_algorithm

        check_algorithm(cfg)  # before a warm start spends minutes
    warm = warm_start(cfg, console)
    train_cfg = cfg
    if warm is not None:
        train_cfg = copy.deepcopy(cfg)
        train_cfg.actor.model.path = str(warm)
    trainer = build_trainer(train_cfg)

    state = trainer.init()
    resumed_from = None
    if resume_path is not None:
        ckpt_dir, step = resume_path
        ts, meta = Checkpointer(ckpt_dir, keep=cfg.runner.keep_checkpoints).restore(step, trainer.snapshot(state))
        state = trainer.start(ts)
        trainer.load_meta(meta)
        resumed_from = trainer.progress(state)[0]

    if primary:
        run_dir.create(cfg)
        _write_placement(trainer, run_dir.path / "placement.json")
    logger = MetricsLogger(run_dir, tensorboard=cfg.runner.tensorboard, write=primary)
    checkpointer = Checkpointer(run_dir.checkpoints, keep=cfg.runner.keep_checkpoints)
    if resumed_from is not None:
        logger.truncate_after(resumed_from)
        checkpointer.delete_after(resumed_from)

    step = trainer.progress(state)[0]
    train_sec, samples = 0.0, 0
    initial = last_eval = None
    label = "sft" if cfg.runner.task == "sft" else "rl"
    show = cfg.runner.progress_bar and primary
    try:
        with _Bar(cfg.runner.max_steps, step, show, console, label) as bar:
            if step == 0:
                t0 = time.perf_counter()
                first = dict(trainer.run_eval(state, _eval_key(cfg, 0)))
                first["time/eval_sec"] = time.perf_counter() - t0
                initial = last_eval = first.get("eval/accuracy")
                logger.log(0, first)
                bar.update(0, first)
            while step < cfg.runner.max_steps:
                target = next_boundary(step, cfg)
                n = target - step
                t0 = time.perf_counter()
                state, metrics = trainer.run_iterations(state, n)
                dt = time.perf_counter() - t0
                train_sec += dt
                samples += n * trainer.samples_per_iteration
                step = target
                final = step == cfg.runner.max_steps
                bad = trainer.progress(state)[1]
                if bad >= cfg.runner.max_nonfinite_updates:
                    logger.log(step, metrics)
                    raise TrainingDiverged(
                        f"{bad} steps in a row produced non-finite losses or gradients (skipped, parameters "
                        f"untouched); stopped at step {step}. Lower actor.optim.lr; the last good checkpoint is "
                        f"in {run_dir.checkpoints}"
                    )
                if _due(step, cfg.runner.eval_interval, final):
                    t0 = time.perf_counter()
                    ev = fetch(trainer.run_eval(state, _eval_key(cfg, step)))
                    metrics.update({k: float(v) for k, v in ev.items()})
                    metrics["time/eval_sec"] = time.perf_counter() - t0
                    last_eval = metrics.get("eval/accuracy", last_eval)
                if _due(step, cfg.runner.log_interval, final) or "eval/accuracy" in metrics:
                    logger.log(step, metrics)
                if _due(step, cfg.runner.save_interval, final):
                    checkpointer.save(step, _checkpoint_state(trainer, state), {"step": step, **trainer.meta()})
                bar.update(step, metrics)
    finally:
        logger.close()
        trainer.close()

    return LMRunSummary(
        run_dir=run_dir.path,
        task=cfg.runner.task,
        steps=step,
        initial_accuracy=initial,
        eval_accuracy=last_eval,
        samples_per_sec=samples / train_sec if train_sec else 0.0,
        wall_sec=time.perf_counter() - t_start,
        resumed_from=resumed_from,
        warm_start=warm,
    )


def _eval_key(cfg: Config, step: int):
    return jax.random.fold_in(jax.random.PRNGKey(cfg.runner.seed + 1), step)
