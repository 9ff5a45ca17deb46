"""An embodied run from start to end: setup and warm start, the trainer its placement
implies, and the host loop with what an embodied run adds (ahead-of-time compile, env-step
throughput, the auto-placement plan's prediction beside what the first chunk measured)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from rlinf_jax.config.schema import Config
from rlinf_jax.envs.tabletop import SPLITS
from rlinf_jax.flow import seeds
from rlinf_jax.flow.host_loop import HostLoop, NothingToDo, enable_compilation_cache, eval_key, open_run_dir
from rlinf_jax.flow.plan import check_before_first_step
from rlinf_jax.runtime.distributed import is_primary
from rlinf_jax.tasks.embodied.build import build_trainer
from rlinf_jax.tasks.embodied.plan import programs as plan_programs
from rlinf_jax.tasks.embodied.setup import make_setup
from rlinf_jax.tasks.embodied.warm_start import warm_start


STRIP_EPISODES = 4  # eval episodes in TensorBoard's strip (rows of the image)


@dataclass
class RunSummary:
    run_dir: Path
    steps: int
    env_steps: int
    eval_return: float | None
    env_steps_per_sec: float
    compile_sec: float
    wall_sec: float
    resumed_from: int | None
    # Success per split of a benchmark that has them (the VLA tabletop): what its runs are judged by.
    eval_success: dict[str, float] | None = None
    # Seeds side by side: the last evaluation's metrics, each over the seeds (`flow.seeds`),
    # and how many runs there were (env_steps counts one run's, env_steps_per_sec all of them).
    last_eval: dict | None = None
    num_runs: int = 1

    def text(self) -> str:
        # A tabletop's returns are fractions of the shaped reward: a rounded one says nothing.
        ret = "n/a" if self.eval_return is None else f"{self.eval_return:.3g}" if self.eval_success else (
            f"{self.eval_return:.1f}")
        if self.last_eval is not None and "eval/return" + seeds.CI in self.last_eval:
            ret = seeds.described(self.last_eval, "eval/return", ".3g" if self.eval_success else ".1f")
        success = "" if not self.eval_success else "  final eval success " + ", ".join(
            f"{split} {value:.3f}" for split, value in self.eval_success.items()) + "\n"
        resumed = "" if self.resumed_from is None else f" (resumed from step {self.resumed_from})"
        per_run = f" per seed ({self.num_runs} seeds)" if self.num_runs > 1 else ""
        return (
            f"[bold]done[/bold]: {self.steps} iterations, {self.env_steps:,} env steps{per_run}{resumed}\n"
            f"{success}"
            f"  final eval return  {ret}\n"
            f"  env-steps/s        {self.env_steps_per_sec:,.0f}{' (all seeds)' if self.num_runs > 1 else ''}\n"
            f"  compile time       {self.compile_sec:.1f} s\n"
            f"  wall time          {self.wall_sec:.1f} s\n"
            f"  saved in           {self.run_dir}"
        )


def placement_info(trainer, measured: float | None = None) -> dict:
    """What placement.json holds: the layout, the runner, and auto-placement's plan."""
    info = trainer.placement.to_json()
    info.update(seeds.runner_info(trainer))
    info["num_micro_batches"] = trainer.cfg.flow.num_micro_batches
    info["max_staleness"] = trainer.cfg.flow.max_staleness
    if trainer.auto_plan is not None:
        info["auto"] = trainer.auto_plan.to_json()
        if measured is not None:
            predicted = trainer.auto_plan.chosen.predicted_env_steps_per_sec
            info["auto"]["measured_env_steps_per_sec"] = round(measured, 1)
            info["auto"]["prediction_error"] = round(predicted / measured - 1.0, 4)
    return info


def split_success(evaluation: dict | None) -> dict[str, float] | None:
    """``{split: success}`` of an evaluation of a benchmark with splits, else None."""
    prefix = "eval/success/"
    found = {k[len(prefix):]: v for k, v in (evaluation or {}).items() if k.startswith(prefix) and "@" not in k}
    return found or None


class EmbodiedLoop(HostLoop):
    """The host loop of an embodied run: chunks are fused or staged PPO iterations."""

    control_shown: ClassVar[dict[str, str]] = {
        "eval/return": "eval", "env/return": "return", "time/env_steps_per_sec": "steps/s",
    }
    eval_metric = "eval/return"
    diverged_hint = "Lower actor.optim.lr or check the env's rewards/observations"

    @property
    def shown(self) -> dict[str, str]:
        """The bar's metrics: on the VLA tabletop the success of each split (what its runs
        are judged by, docs/vla.md), elsewhere the returns."""
        if self.cfg.env.suite != "tabletop":
            return self.control_shown
        labels = {split: f"success: {split}" if i == 0 else split for i, split in enumerate(SPLITS)}
        return {**{f"eval/success/{s}": label for s, label in labels.items()}, "time/env_steps_per_sec": "steps/s"}

    def placement_info(self, metrics: dict | None = None) -> dict:
        measured = None if metrics is None else metrics["time/env_steps_per_sec"]
        return placement_info(self.trainer, measured)

    def eval_media(self, state, step: int) -> dict:
        """An image strip of the first eval episodes (envs with camera observations), in
        every layout: the staged runners draw it from their learner's state."""
        trainer = self.trainer
        if not trainer.image_observations:
            return {}
        return {"eval/episodes": trainer.strip(state, eval_key(self.cfg, step), STRIP_EPISODES)}

    def first_record(self, state) -> dict:
        first = {"time/compile_sec": self.compile_sec}
        warm = self.trainer.warm_start_metrics
        if warm is not None:
            # A warm-started policy is evaluated before RL touches it: the baseline the
            # run's gain is measured from.
            first.update(warm)
            first.update(self.evaluate(state, 0))
        plan = self.trainer.auto_plan
        if plan is not None:
            first["placement/predicted_env_steps_per_sec"] = plan.chosen.predicted_env_steps_per_sec
            first["time/placement_profile_sec"] = plan.profile_sec
        return first

    def run_chunk(self, state, n: int):
        state, sums = self.trainer.run_iterations(state, n)
        metrics = self.trainer.summarize(sums, n)  # blocks until the chunk is done
        metrics.update(self.trainer.flow_stats())
        return state, metrics

    def chunk_metrics(self, metrics: dict, n: int, dt: float, first_chunk: bool, step: int) -> None:
        per_iteration = self.trainer.env_steps_per_iteration
        # The machine's throughput: every run of a seed batch steps its own envs.
        metrics["time/env_steps_per_sec"] = n * per_iteration * self.trainer.num_runs / dt
        plan = self.trainer.auto_plan
        if plan is not None and first_chunk:
            # The plan's prediction next to what the first chunk actually ran at.
            metrics["placement/predicted_env_steps_per_sec"] = plan.chosen.predicted_env_steps_per_sec
            metrics["placement/measured_env_steps_per_sec"] = metrics["time/env_steps_per_sec"]
            self.write_placement(metrics)
        metrics["env/steps"] = step * per_iteration


def run(cfg: Config, console=None) -> RunSummary | NothingToDo:
    """Trains (or resumes) the run that ``cfg`` describes and returns its summary."""
    t_start = time.perf_counter()
    enable_compilation_cache(cfg.runner.compilation_cache)
    log = console.print if console is not None and cfg.runner.progress_bar and is_primary() else None
    # Checked before minutes of warm start: a fresh start must not overwrite a run.
    with open_run_dir(cfg) as opened:
        if opened.done is not None:
            return opened.done
        run_dir, resume_path = opened.run_dir, opened.resume_path
        check_before_first_step(cfg, lambda devices: plan_programs(cfg, devices, twins=False), console)
        setup = make_setup(cfg)
        if resume_path is None:  # a resumed run restores its parameters; a warm start would be lost
            setup = warm_start(cfg, setup)
        trainer = build_trainer(cfg, setup, log=log)
        result = EmbodiedLoop(cfg, trainer, run_dir, resume_path, console).run()
        per_iteration = trainer.env_steps_per_iteration
        ran = result.step - result.start_step
        return RunSummary(
            run_dir=result.run_dir,
            steps=result.step,
            env_steps=result.step * per_iteration,
            eval_return=None if result.last_eval is None else result.last_eval["eval/return"],
            env_steps_per_sec=ran * per_iteration * trainer.num_runs / result.train_sec if result.train_sec else 0.0,
            compile_sec=result.compile_sec,
            wall_sec=time.perf_counter() - t_start,
            resumed_from=result.resumed_from,
            eval_success=split_success(result.last_eval),
            last_eval=result.last_eval,
            num_runs=trainer.num_runs,
        )
