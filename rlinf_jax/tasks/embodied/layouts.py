"""An embodied trainer for a given placement: the `PPO` algorithm under the fused runner
(`flow.fused.Fused`, one jitted chunk) where it applies, under the staged runner
(`flow.staged.Staged`) everywhere else, the host runner (`flow.host.Host`) on a host
simulator."""

from __future__ import annotations

import jax

from rlinf_jax.algos import GROUP_OUTCOME_ADVANTAGES
from rlinf_jax.config.schema import Config
from rlinf_jax.errors import BadInput
from rlinf_jax.envs.host.suite import is_host_suite
from rlinf_jax.flow import runners
from rlinf_jax.flow.fused import Fused
from rlinf_jax.flow.host import Host
from rlinf_jax.flow.seeds import resolve_seeds, seed_batch
from rlinf_jax.flow.stage import COMPONENTS
from rlinf_jax.flow.staged import Staged
from rlinf_jax.sharding import Placement, component_mesh, resolve_num_devices, resolve_placement, with_phase
from rlinf_jax.tasks.embodied.algorithm import PPO
from rlinf_jax.tasks.embodied.setup import Setup


def resolve_embodied_placement(cfg: Config, num_devices: int) -> Placement:
    """The run's placement; with cluster.scaling=dynamic, its ``update`` phase: the actor's
    devices plus the rollout's (idle while the actor learns, and its weights are replaced
    after). The env keeps its devices: they hold the env state the next rollout steps."""
    c = cfg.cluster
    out = resolve_placement(c.component_placement, COMPONENTS, num_devices, c.mesh)
    return with_phase(out, "update", "actor", ("rollout",)) if c.scaling == "dynamic" else out


def placed_trainer(cfg: Config, setup: Setup, placement: Placement | None = None):
    """The trainer of ``cfg`` on ``placement`` (default: ``cluster.component_placement``,
    which must not be ``auto`` here).

    Fused needs everything collocated, strictly on-policy and one micro-batch; it is the
    fastest layout for small policies. Anything else runs as stages.
    """
    num_devices = resolve_num_devices(cfg.cluster.num_devices)
    devices = jax.devices()[:num_devices]
    seeds = resolve_seeds(cfg.runner)
    if placement is None and cfg.cluster.component_placement == "auto" and (is_host_suite(cfg.env) or len(seeds) > 1):
        # One runner for a host simulator, and for seeds side by side (the fused one):
        # nothing for auto-placement to choose.
        placement = resolve_placement("collocated", COMPONENTS, num_devices, cfg.cluster.mesh)
    elif placement is None:
        placement = resolve_embodied_placement(cfg, num_devices)
    if cfg.cluster.scaling == "dynamic" and not placement.phases:
        raise BadInput(
            "cluster.scaling=dynamic lends devices between components, and this run is placed collocated (a host "
            "simulator or seeds side by side under component_placement=auto): use cluster.scaling=static"
        )
    if is_host_suite(cfg.env) and placement.phases:
        raise BadInput(
            f"cluster.scaling=dynamic is not built for host simulators ({cfg.env.suite}) yet: their runner keeps the "
            "actor on its own devices; use cluster.scaling=static"
        )
    if is_host_suite(cfg.env):
        if cfg.algorithm.adv_type in GROUP_OUTCOME_ADVANTAGES:
            # Groups share a reset state, which a host simulator's seeds per env do not give.
            raise BadInput(
                f"algorithm.adv_type={cfg.algorithm.adv_type} needs envs that share resets; host simulators "
                "(env.suite=gym) run gae-style estimators: set algorithm.adv_type=gae"
            )
        # A host simulator steps outside jit: the host runner, pipelined by
        # flow.num_micro_batches, over the same PPO (the host runner evaluates on the host).
        algorithm = PPO(cfg, setup, component_mesh(placement, "actor", devices), evaluates=False)
        trainer = Host(algorithm, placement, devices)
    else:
        algorithm = PPO(cfg, setup, component_mesh(placement, "actor", devices))
        fused = runners.fused(cfg.flow, placement)
        trainer = Fused(algorithm, placement) if fused else Staged(algorithm, placement, devices)
    return seed_batch(trainer, seeds, lambda: why_not_batched(cfg, setup, trainer))


def why_not_batched(cfg: Config, setup: Setup, trainer) -> str | None:
    """What keeps the run from training its seeds side by side (None: nothing)."""
    if is_host_suite(cfg.env):
        return f"{cfg.env.suite} simulators step in worker processes, outside the program: run one seed per run"
    if not isinstance(trainer, Fused):
        return ("it needs cluster.component_placement=collocated, flow.num_micro_batches=1 and flow.max_staleness=0 "
                "(got a staged layout)")
    if cfg.actor.model.matmul != "xla":
        return (f"actor.model.matmul={cfg.actor.model.matmul}'s custom calls would run the seeds one after another: "
                "use actor.model.matmul=xla")
    return None
