"""The host loop of a run that steps environments, and its `run` from start to end.

Both env-stepping tasks (embodied PPO, the off-policy family) train through `EnvLoop` and
an `flow.trainer.EnvTrainer` of any layout; each task's subclass only names what is its own
(the keys placement.json adds, iterations that step no env, extra throughput). The loop
adds to the shared `HostLoop`: ahead-of-time compile time at step 0, env-step throughput
over every seed side by side, the warm start's baseline evaluation, an episode strip for
camera envs, and auto-placement's prediction beside what the first chunk measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar

from rlinf_jax.config.schema import Config
from rlinf_jax.flow import seeds
from rlinf_jax.flow.host_loop import HostLoop, LoopResult, NothingToDo, enable_compilation_cache, eval_key, open_run_dir
from rlinf_jax.flow.plan import check_before_first_step
from rlinf_jax.flow.trainer import EnvTrainer
from rlinf_jax.tasks.env_rl.summary import RunSummary, split_success

STRIP_EPISODES = 4  # eval episodes in TensorBoard's strip (rows of the image)


class EnvLoop(HostLoop):
    """Runs an `EnvTrainer`; ``auto_plan`` is auto-placement's plan when it chose the layout."""

    shown: ClassVar[dict[str, str]] = {
        "eval/return": "eval", "env/return": "return", "time/env_steps_per_sec": "steps/s",
    }
    eval_metric = "eval/return"
    trainer: EnvTrainer

    def __init__(self, cfg: Config, trainer: EnvTrainer, run_dir, resume_path, console=None, auto_plan=None):
        super().__init__(cfg, trainer, run_dir, resume_path, console)
        self.auto_plan = auto_plan

    # ------------------------------------------------------------------ what tasks add
    def layout_info(self) -> dict:
        """What placement.json says beside the placement and the runner."""
        return {}

    def offline_iterations(self, step: int) -> int:
        """How many of the first ``step`` iterations stepped no env (offline learning)."""
        return 0

    # ------------------------------------------------------------------ the hooks
    def env_steps(self, step: int) -> int:
        """Env steps of one run after ``step`` iterations."""
        return (step - self.offline_iterations(step)) * self.trainer.env_steps_per_iteration

    def placement_info(self, metrics: dict | None = None) -> dict:
        """The layout, the runner (and seeds), the task's keys, and auto-placement's plan
        with, once the first chunk ran, what it measured against what was predicted."""
        info = self.trainer.placement.to_json()
        info.update(seeds.runner_info(self.trainer))
        info.update(self.layout_info())
        plan = self.auto_plan
        if plan is not None:
            info["auto"] = plan.to_json()
            if metrics is not None:
                predicted, measured = plan.chosen.predicted_env_steps_per_sec, metrics["time/env_steps_per_sec"]
                info["auto"]["measured_env_steps_per_sec"] = round(measured, 1)
                info["auto"]["prediction_error"] = round(predicted / measured - 1.0, 4)
        return info

    def first_record(self, state) -> dict:
        first = {"time/compile_sec": self.compile_sec}
        warm = self.trainer.warm_start_metrics
        if warm is not None:
            # A warm-started policy is evaluated before RL touches it: the baseline the
            # run's gain is measured from.
            first.update(warm)
            first.update(self.evaluate(state, 0))
        if self.auto_plan is not None:
            first["placement/predicted_env_steps_per_sec"] = self.auto_plan.chosen.predicted_env_steps_per_sec
            first["time/placement_profile_sec"] = self.auto_plan.profile_sec
        return first

    def eval_media(self, state, step: int) -> dict:
        """An image strip of the first eval episodes (envs with camera observations), in
        every layout: the staged runners draw it from their learner's state."""
        if not self.trainer.image_observations:
            return {}
        return {"eval/episodes": self.trainer.strip(state, eval_key(self.cfg, step), STRIP_EPISODES)}

    def run_chunk(self, state, n: int):
        state, sums = self.trainer.run_iterations(state, n)
        metrics = self.trainer.summarize(sums, n)  # blocks until the chunk is done
        metrics.update(self.trainer.flow_stats())
        return state, metrics

    def chunk_metrics(self, metrics: dict, n: int, dt: float, first_chunk: bool, step: int) -> None:
        # The machine's throughput: every run of a seed batch steps its own envs.
        per_iteration = self.trainer.env_steps_per_iteration
        metrics["time/env_steps_per_sec"] = n * per_iteration * self.trainer.num_runs / dt
        if self.auto_plan is not None and first_chunk:
            # The plan's prediction next to what the first chunk actually ran at.
            metrics["placement/predicted_env_steps_per_sec"] = self.auto_plan.chosen.predicted_env_steps_per_sec
            metrics["placement/measured_env_steps_per_sec"] = metrics["time/env_steps_per_sec"]
            self.write_placement(metrics)
        metrics["env/steps"] = self.env_steps(step)

    def summary(self, result: LoopResult, wall_sec: float) -> RunSummary:
        """What the finished run reports (env steps per second over the steps this invocation ran)."""
        t = self.trainer
        ran = result.step - result.start_step
        return RunSummary(
            run_dir=result.run_dir,
            steps=result.step,
            env_steps=self.env_steps(result.step),
            eval_return=None if result.last_eval is None else result.last_eval["eval/return"],
            env_steps_per_sec=ran * t.env_steps_per_iteration * t.num_runs / result.train_sec if result.train_sec else 0.0,
            compile_sec=result.compile_sec,
            wall_sec=wall_sec,
            resumed_from=result.resumed_from,
            eval_success=split_success(result.last_eval),
            last_eval=result.last_eval,
            num_runs=t.num_runs,
        )


# ``build(resumed) -> (trainer, auto-placement's plan or None)``: called once the run folder
# is claimed and the plan's memory check passed; ``resumed`` says whether a checkpoint
# will replace the trainer's initial state (a warm start would be lost on it).
Build = Callable[[bool], tuple[EnvTrainer, Any]]


def run(cfg: Config, console, loop: type[EnvLoop], programs, build: Build) -> RunSummary | NothingToDo:
    """Trains (or resumes) the run ``cfg`` describes under ``loop`` and returns its summary.

    ``programs(devices)``: the run's programs for the memory check before the first step
    (`flow.plan.check_before_first_step`).
    """
    t_start = time.perf_counter()
    enable_compilation_cache(cfg.runner.compilation_cache)
    # The folder first: a fresh start must not overwrite a run, checked before minutes of
    # warm start or compiling.
    with open_run_dir(cfg) as opened:
        if opened.done is not None:
            return opened.done
        check_before_first_step(cfg, programs, console)
        trainer, plan = build(opened.resume_path is not None)
        runner = loop(cfg, trainer, opened.run_dir, opened.resume_path, console, auto_plan=plan)
        result = runner.run()
        return runner.summary(result, time.perf_counter() - t_start)
