"""The trainer of an embodied run: its setup (warm start included), then the layout that
``cluster.component_placement`` names, or the one auto-placement measures fastest."""

from __future__ import annotations

from rlinf_jax.config.schema import Config
from rlinf_jax.envs.host.suite import is_host_suite
from rlinf_jax.errors import BadInput
from rlinf_jax.runtime.distributed import is_multiprocess
from rlinf_jax.flow.seeds import resolve_seeds
from rlinf_jax.sharding import Placement, resolve_num_devices
from rlinf_jax.flow.trainer import EnvTrainer
from rlinf_jax.tasks.embodied.auto_placement import AutoPlan, auto_placement
from rlinf_jax.tasks.embodied.layouts import placed_trainer
from rlinf_jax.tasks.embodied.setup import Setup, make_setup
from rlinf_jax.tasks.embodied.warm_start import warm_start_runs


def build_trainer(cfg: Config, setup: Setup | None = None, placement: Placement | None = None,
                  log=None) -> EnvTrainer:
    """The trainer for ``cfg``; ``setup`` defaults to a fresh one with the run's warm start."""
    return build_placed(cfg, setup, placement, log)[0]


def build_placed(cfg: Config, setup: Setup | None = None, placement: Placement | None = None,
                 log=None) -> tuple[EnvTrainer, AutoPlan | None]:
    """`build_trainer`'s trainer, and auto-placement's plan when it chose the layout."""
    seeds = resolve_seeds(cfg.runner)
    if setup is None:
        setup = warm_start_runs(cfg, make_setup(cfg), seeds)
    # Auto-placement times JAX env layouts; a host simulator has one runner.
    # Seeds side by side run in the fused runner: placed_trainer takes its collocated layout.
    batched = len(seeds) > 1
    if placement is None and cfg.cluster.component_placement == "auto" and not is_host_suite(cfg.env) and not batched:
        if is_multiprocess():
            # Each process would time the candidates itself and might pick another one.
            raise BadInput(
                "cluster.component_placement=auto is not available in multi-host runs yet; "
                "name a preset (collocated, disaggregated, hybrid) or a mapping"
            )
        plan = auto_placement(cfg, setup, resolve_num_devices(cfg.cluster.num_devices), log=log)
        if log:
            log(f"auto-placement: chose {plan.chosen.candidate.name} ({plan.placement.mode}) after {plan.profile_sec:.1f} s of profiling")
        return plan.trainer, plan
    return placed_trainer(cfg, setup, placement), None
