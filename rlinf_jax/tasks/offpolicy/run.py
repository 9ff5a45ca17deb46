"""An off-policy run from start to end: the setup, the trainer its placement implies, and
the host loop with what an off-policy run adds (env-step and gradient-step throughput)."""

from __future__ import annotations

import time
from typing import ClassVar

import jax

from rlinf_jax.config.schema import Config
from rlinf_jax.envs.host.suite import is_host_suite
from rlinf_jax.errors import BadInput
from rlinf_jax.flow import runners
from rlinf_jax.flow.host_loop import HostLoop, NothingToDo, enable_compilation_cache, open_run_dir
from rlinf_jax.flow.plan import check_before_first_step
from rlinf_jax.flow.seeds import resolve_seeds, runner_info, seed_batch
from rlinf_jax.runtime.distributed import is_primary
from rlinf_jax.sharding import component_mesh, resolve_num_devices, resolve_placement
from rlinf_jax.tasks.embodied.run import RunSummary
from rlinf_jax.tasks.offpolicy.config import COMPONENTS
from rlinf_jax.tasks.offpolicy.host import HostOffPolicy
from rlinf_jax.tasks.offpolicy.plan import programs as plan_programs
from rlinf_jax.tasks.offpolicy.setup import OffPolicySetup, make_setup
from rlinf_jax.tasks.offpolicy.staged import StagedOffPolicy
from rlinf_jax.tasks.offpolicy.trainer import OffPolicyTrainer



def build_trainer(cfg: Config, setup: OffPolicySetup | None = None, placement=None):
    """The fused trainer where it applies (collocated, synchronous), the staged one elsewhere;
    on a host simulator the host loop's."""
    setup = make_setup(cfg) if setup is None else setup
    num_devices = resolve_num_devices(cfg.cluster.num_devices)
    devices = jax.devices()[:num_devices]
    if placement is None:
        if cfg.cluster.component_placement == "auto":
            raise BadInput(
                "cluster.component_placement=auto is not available for the off-policy family yet; name a preset "
                "(collocated, disaggregated, hybrid) or a mapping"
            )
        placement = resolve_placement(cfg.cluster.component_placement, COMPONENTS, num_devices, cfg.cluster.mesh)
    if is_host_suite(cfg.env):
        trainer = HostOffPolicy(cfg, setup, component_mesh(placement, "actor", devices))
    elif runners.fused(cfg.flow, placement):
        trainer = OffPolicyTrainer(cfg, setup, component_mesh(placement, "actor", devices))
    else:
        trainer = StagedOffPolicy(cfg, setup, placement, devices)
    trainer.placement = placement
    return seed_batch(trainer, resolve_seeds(cfg.runner), lambda: why_not_batched(cfg, trainer))


def why_not_batched(cfg: Config, trainer) -> str | None:
    """What keeps the run from training its seeds side by side (None: nothing)."""
    if is_host_suite(cfg.env):
        return f"{cfg.env.suite} simulators step in worker processes, outside the program: run one seed per run"
    if not isinstance(trainer, OffPolicyTrainer):
        return ("it needs cluster.component_placement=collocated and flow.max_staleness=0 (got a staged layout)")
    if cfg.actor.model.matmul != "xla":
        return (f"actor.model.matmul={cfg.actor.model.matmul}'s custom calls would run the seeds one after another: "
                "use actor.model.matmul=xla")
    return None


class OffPolicyLoop(HostLoop):
    shown: ClassVar[dict[str, str]] = {"eval/return": "eval", "env/return": "return", "time/env_steps_per_sec": "steps/s"}
    eval_metric = "eval/return"
    diverged_hint = "Lower actor.optim.lr / actor.optim.critic_lr or check the env's rewards"

    def placement_info(self, metrics: dict | None = None) -> dict:
        info = self.trainer.placement.to_json()
        info.update(runner_info(self.trainer))
        info["replay"] = "actor"
        info["max_staleness"] = self.cfg.flow.max_staleness
        return info

    def first_record(self, state) -> dict:
        return {"time/compile_sec": self.compile_sec}

    def run_chunk(self, state, n: int):
        state, sums = self.trainer.run_iterations(state, n)
        return state, self.trainer.summarize(sums, n)  # blocks until the chunk is done

    def chunk_metrics(self, metrics: dict, n: int, dt: float, first_chunk: bool, step: int) -> None:
        t = self.trainer
        # The machine's throughput: every run of a seed batch steps its own envs and learner.
        metrics["time/env_steps_per_sec"] = n * t.env_steps_per_iteration * t.num_runs / dt
        metrics["time/grad_steps_per_sec"] = metrics["train/gradient_steps"] * t.num_runs / dt
        offline = min(self.cfg.algorithm.offline_iterations, step)
        metrics["env/steps"] = (step - offline) * t.env_steps_per_iteration


def run(cfg: Config, console=None) -> RunSummary | NothingToDo:
    """Trains (or resumes) the run that ``cfg`` describes and returns its summary."""
    t_start = time.perf_counter()
    enable_compilation_cache(cfg.runner.compilation_cache)
    with open_run_dir(cfg) as opened:
        if opened.done is not None:
            return opened.done
        run_dir, resume_path = opened.run_dir, opened.resume_path
        check_before_first_step(cfg, lambda devices: plan_programs(cfg, devices), console)
        trainer = build_trainer(cfg)
        result = OffPolicyLoop(cfg, trainer, run_dir, resume_path, console).run()
        per_iteration = trainer.env_steps_per_iteration
        ran = result.step - result.start_step
        offline = min(cfg.algorithm.offline_iterations, result.step)
        return RunSummary(
            run_dir=result.run_dir,
            steps=result.step,
            env_steps=(result.step - offline) * per_iteration,
            eval_return=None if result.last_eval is None else result.last_eval["eval/return"],
            env_steps_per_sec=ran * per_iteration * trainer.num_runs / result.train_sec if result.train_sec else 0.0,
            compile_sec=result.compile_sec,
            wall_sec=time.perf_counter() - t_start,
            resumed_from=result.resumed_from,
            last_eval=result.last_eval,
            num_runs=trainer.num_runs,
        )
