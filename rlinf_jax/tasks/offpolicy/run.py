"""An off-policy run from start to end: the setup, the trainer its placement implies, under
the env-stepping loop (`tasks.env_rl.loop`) with what the off-policy family adds
(gradient-step throughput, offline iterations that step no env)."""

from __future__ import annotations

import jax

from rlinf_jax.config.schema import Config
from rlinf_jax.envs.host.suite import is_host_suite
from rlinf_jax.errors import BadInput
from rlinf_jax.flow import runners
from rlinf_jax.flow.fused import Fused
from rlinf_jax.flow.host import Host
from rlinf_jax.flow.host_loop import NothingToDo
from rlinf_jax.flow.seeds import resolve_seeds, seed_batch
from rlinf_jax.flow.stage import COMPONENTS
from rlinf_jax.flow.staged import Staged
from rlinf_jax.flow.trainer import EnvTrainer
from rlinf_jax.sharding import component_mesh, resolve_num_devices, resolve_placement
from rlinf_jax.tasks.env_rl import loop as env_loop
from rlinf_jax.tasks.env_rl.summary import RunSummary
from rlinf_jax.tasks.offpolicy.algorithm import OffPolicy
from rlinf_jax.tasks.offpolicy.plan import programs as plan_programs
from rlinf_jax.tasks.offpolicy.setup import OffPolicySetup, make_setup


def build_trainer(cfg: Config, setup: OffPolicySetup | None = None, placement=None) -> EnvTrainer:
    """The `OffPolicy` algorithm under the fused runner where it applies (collocated,
    synchronous), the staged runner elsewhere; on a host simulator the host runner."""
    if cfg.cluster.scaling == "dynamic":
        # Off-policy learners step every env step, interleaved with acting: no phase leaves
        # the rollout's devices idle for the update to borrow.
        raise BadInput(
            f"cluster.scaling=dynamic is for on-policy runs (PPO, GRPO); {cfg.algorithm.name} learns between env "
            "steps, so there is no idle phase to lend devices from: use cluster.scaling=static"
        )
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
        trainer = Host(OffPolicy(cfg, setup, component_mesh(placement, "actor", devices)), placement, devices)
    elif runners.fused(cfg.flow, placement):
        trainer = Fused(OffPolicy(cfg, setup, component_mesh(placement, "actor", devices)), placement)
    else:
        trainer = Staged(OffPolicy(cfg, setup, component_mesh(placement, "actor", devices)), placement, devices)
    return seed_batch(trainer, resolve_seeds(cfg.runner), lambda: why_not_batched(cfg, trainer))


def why_not_batched(cfg: Config, trainer) -> str | None:
    """What keeps the run from training its seeds side by side (None: nothing)."""
    if is_host_suite(cfg.env):
        return f"{cfg.env.suite} simulators step in worker processes, outside the program: run one seed per run"
    if not isinstance(trainer, Fused):
        return ("it needs cluster.component_placement=collocated and flow.max_staleness=0 (got a staged layout)")
    if cfg.actor.model.matmul != "xla":
        return (f"actor.model.matmul={cfg.actor.model.matmul}'s custom calls would run the seeds one after another: "
                "use actor.model.matmul=xla")
    return None


class OffPolicyLoop(env_loop.EnvLoop):
    diverged_hint = "Lower actor.optim.lr / actor.optim.critic_lr or check the env's rewards"

    def layout_info(self) -> dict:
        return {"replay": "actor", "max_staleness": self.cfg.flow.max_staleness}

    def offline_iterations(self, step: int) -> int:
        return min(self.cfg.algorithm.offpolicy.offline_iterations, step)

    def chunk_metrics(self, metrics: dict, n: int, dt: float, first_chunk: bool, step: int) -> None:
        super().chunk_metrics(metrics, n, dt, first_chunk, step)
        # Every run of a seed batch takes its own gradient steps.
        metrics["time/grad_steps_per_sec"] = metrics["train/gradient_steps"] * self.trainer.num_runs / dt


def run(cfg: Config, console=None) -> RunSummary | NothingToDo:
    """Trains (or resumes) the run that ``cfg`` describes and returns its summary."""
    return env_loop.run(cfg, console, OffPolicyLoop, lambda devices: plan_programs(cfg, devices),
                        lambda resumed: (build_trainer(cfg), None))
