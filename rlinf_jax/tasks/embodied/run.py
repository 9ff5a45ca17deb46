"""An embodied run from start to end: setup and warm start, the trainer its placement
implies (or auto-placement measures fastest), under the env-stepping loop
(`tasks.env_rl.loop`) with what PPO's layouts add to placement.json."""

from __future__ import annotations

from rlinf_jax.config.schema import Config
from rlinf_jax.envs.tabletop import SPLITS
from rlinf_jax.flow.host_loop import NothingToDo
from rlinf_jax.flow.seeds import resolve_seeds
from rlinf_jax.runtime.distributed import is_primary
from rlinf_jax.tasks.embodied.build import build_placed
from rlinf_jax.tasks.embodied.plan import programs as plan_programs
from rlinf_jax.tasks.embodied.setup import make_setup
from rlinf_jax.tasks.embodied.warm_start import warm_start_runs
from rlinf_jax.tasks.env_rl import loop as env_loop
from rlinf_jax.tasks.env_rl.summary import RunSummary


class EmbodiedLoop(env_loop.EnvLoop):
    """The env-stepping loop of embodied PPO: chunks are fused, staged or host iterations."""

    diverged_hint = "Lower actor.optim.lr or check the env's rewards/observations"

    @property
    def shown(self) -> dict[str, str]:
        """The bar's metrics: on the VLA tabletop the success of each split (what its runs
        are judged by, docs/vla.md), elsewhere the returns."""
        if self.cfg.env.suite != "tabletop":
            return env_loop.EnvLoop.shown
        labels = {split: f"success: {split}" if i == 0 else split for i, split in enumerate(SPLITS)}
        return {**{f"eval/success/{s}": label for s, label in labels.items()}, "time/env_steps_per_sec": "steps/s"}

    def layout_info(self) -> dict:
        return {"num_micro_batches": self.cfg.flow.num_micro_batches, "max_staleness": self.cfg.flow.max_staleness}


def run(cfg: Config, console=None) -> RunSummary | NothingToDo:
    """Trains (or resumes) the run that ``cfg`` describes and returns its summary."""
    log = console.print if console is not None and cfg.runner.progress_bar and is_primary() else None

    def build(resumed: bool):
        setup = make_setup(cfg)
        if not resumed:  # a resumed run restores its parameters; a warm start would be lost
            setup = warm_start_runs(cfg, setup, resolve_seeds(cfg.runner))
        return build_placed(cfg, setup, log=log)

    return env_loop.run(cfg, console, EmbodiedLoop, lambda devices: plan_programs(cfg, devices, twins=False), build)
