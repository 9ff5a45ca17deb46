"""An embodied PPO run: its flow, placement and what its host loop adds.

The flow is the fused `PPOTrainer` (a chunk of iterations is one jit) or the staged
`StagedPPO` (stages on component meshes), chosen from the placement; both offer the
same small interface (init/start/snapshot/compile/run_iterations/run_eval). The loop
itself (resume, cadence, logs, checkpoints; multi-host roles) is `flow.host_loop`'s;
this module adds the ahead-of-time compile, env-step throughput and the auto-placement
plan's prediction next to what the first chunk measured.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import jax

from rlinf_jax.config.schema import Config
from rlinf_jax.envs import make_env, make_eval_env
from rlinf_jax.errors import BadInput
from rlinf_jax.flow.embodied_ppo import PPOTrainer
from rlinf_jax.flow.host_loop import (  # noqa: F401  (TrainingDiverged re-exported for callers)
    HostLoop,
    TrainingDiverged,
    enable_compilation_cache,
    open_run_dir,
)
from rlinf_jax.runtime.distributed import (
    is_multiprocess,
    is_primary,
    local_devices_first,
)
from rlinf_jax.sharding import (
    Placement,
    component_mesh,
    resolve_num_devices,
    resolve_placement,
)

EMBODIED_COMPONENTS = ("env", "rollout", "actor")


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


def resolve_embodied_placement(cfg: Config, num_devices: int) -> Placement:
    return resolve_placement(cfg.cluster.component_placement, EMBODIED_COMPONENTS, num_devices, cfg.cluster.mesh)


def build_trainer(cfg: Config, placement: Placement | None = None, log=None):
    """The flow for ``cfg``: the fused single-jit trainer where it applies, else staged.

    Fused needs everything collocated, strictly on-policy and one micro-batch; it is the
    fastest layout for small policies. Anything else runs as stages (`StagedPPO`).
    """
    from rlinf_jax.flow.embodied_staged import StagedPPO

    with local_devices_first():
        env = make_env(cfg.env)
        eval_env = make_eval_env(cfg.env)
    num_devices = resolve_num_devices(cfg.cluster.num_devices)
    devices = jax.devices()[:num_devices]
    if placement is None:
        if cfg.cluster.component_placement == "auto" and is_multiprocess():
            # Each process would time the candidates itself and might pick another one.
            raise BadInput(
                "cluster.component_placement=auto is not available in multi-host runs yet; "
                "name a preset (collocated, disaggregated, hybrid) or a mapping"
            )
        if cfg.cluster.component_placement == "auto":
            from rlinf_jax.flow.auto_placement import auto_placement

            plan = auto_placement(cfg, num_devices, log=log)
            if log:
                log(f"auto-placement: chose {plan.chosen.candidate.name} ({plan.placement.mode}) after {plan.profile_sec:.1f} s of profiling")
            plan.trainer.auto_plan = plan
            return plan.trainer
        placement = resolve_embodied_placement(cfg, num_devices)
    f = cfg.flow
    fusable = placement.mode == "collocated" and f.num_micro_batches == 1 and f.max_staleness == 0
    if f.runner == "fused" and not fusable:
        raise BadInput(
            f"flow.runner=fused needs a collocated placement, flow.num_micro_batches=1 and flow.max_staleness=0 "
            f"(got {placement.mode}, {f.num_micro_batches}, {f.max_staleness}); use flow.runner=auto"
        )
    if f.runner == "fused" or (f.runner == "auto" and fusable):
        trainer = PPOTrainer(cfg, env, eval_env, component_mesh(placement, "actor", devices))
    else:
        trainer = StagedPPO(cfg, env, eval_env, placement, devices)
    trainer.placement = placement
    trainer.auto_plan = None
    return trainer


def _write_placement(trainer, path: Path, measured: float | None = None) -> None:
    info = trainer.placement.to_json()
    info["runner"] = type(trainer).__name__
    info["num_micro_batches"] = trainer.cfg.flow.num_micro_batches
    info["max_staleness"] = trainer.cfg.flow.max_staleness
    if trainer.auto_plan is not None:
        info["auto"] = trainer.auto_plan.to_json()
        if measured is not None:
            predicted = trainer.auto_plan.chosen.predicted_env_steps_per_sec
            info["auto"]["measured_env_steps_per_sec"] = round(measured, 1)
            info["auto"]["prediction_error"] = round(predicted / measured - 1.0, 4)
    path.write_text(json.dumps(info, indent=2) + "\n")


class EmbodiedLoop(HostLoop):
    """The host loop of an embodied PPO run: chunks are fused or staged PPO iterations."""

    shown: ClassVar[dict[str, str]] = {"eval/return": "eval", "env/return": "return", "time/env_steps_per_sec": "steps/s"}
    eval_metric = "eval/return"
    diverged_hint = "Lower actor.optim.lr or check the env's rewards/observations"

    def write_placement(self, path: Path, metrics: dict | None = None) -> None:
        _write_placement(self.trainer, path, None if metrics is None else metrics["time/env_steps_per_sec"])

    def compile(self, state) -> None:
        self.trainer.compile(state, jax.random.PRNGKey(self.cfg.runner.seed + 1))

    def first_record(self, state) -> dict:
        first = {"time/compile_sec": self.compile_sec}
        core = getattr(self.trainer, "core", self.trainer)  # the staged runner wraps a PPOTrainer
        warm = getattr(core, "warm_start_metrics", None)
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
        metrics["time/env_steps_per_sec"] = n * per_iteration / dt
        plan = self.trainer.auto_plan
        if plan is not None and first_chunk:
            # The plan's prediction next to what the first chunk actually ran at.
            metrics["placement/predicted_env_steps_per_sec"] = plan.chosen.predicted_env_steps_per_sec
            metrics["placement/measured_env_steps_per_sec"] = metrics["time/env_steps_per_sec"]
            if self.primary:
                self.write_placement(self.run_dir.path / "placement.json", metrics)
        metrics["env/steps"] = step * per_iteration


def run(cfg: Config, console=None) -> RunSummary:
    """Trains (or resumes) the run that ``cfg`` describes and returns its summary."""
    t_start = time.perf_counter()
    enable_compilation_cache(cfg.runner.compilation_cache)
    log = console.print if console is not None and cfg.runner.progress_bar and is_primary() else None
    trainer = build_trainer(cfg, log=log)
    run_dir, resume_path = open_run_dir(cfg)
    result = EmbodiedLoop(cfg, trainer, run_dir, resume_path, console).run()
    per_iteration = trainer.env_steps_per_iteration
    ran = result.step - result.start_step
    return RunSummary(
        run_dir=result.run_dir,
        steps=result.step,
        env_steps=result.step * per_iteration,
        eval_return=None if result.last_eval is None else result.last_eval["eval/return"],
        env_steps_per_sec=ran * per_iteration / result.train_sec if result.train_sec else 0.0,
        compile_sec=result.compile_sec,
        wall_sec=time.perf_counter() - t_start,
        resumed_from=result.resumed_from,
    )
