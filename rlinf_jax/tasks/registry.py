"""The tasks a run can be (``runner.task``), each a package of its own under ``tasks/``.

The CLIs and the launcher look a task up here instead of branching on its name: its run
(config -> summary), the device components its placement maps, and the config checks that
need the task's own knowledge.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlinf_jax.config.loader import compose
from rlinf_jax.config.reads import Reads, check_reads
from rlinf_jax.config.schema import Config
from rlinf_jax.envs.mjx_import import import_mjx, uses_warp
from rlinf_jax.errors import BadInput
from rlinf_jax.flow.seeds import resolve_seeds
from rlinf_jax.tasks.embodied import config as embodied_config
from rlinf_jax.tasks.offpolicy import config as offpolicy_config
from rlinf_jax.tasks.reasoning import config as reasoning_config
from rlinf_jax.tasks.sft import config as sft_config
from rlinf_jax.tasks.sft import lm as sft_lm

# The tasks whose fused runs train several seeds side by side (`flow.seeds`).
SEED_BATCHES = ("embodied", "offpolicy")

# Each task's run is imported on its first call: a run reaches its simulators and models
# (MuJoCo's MJX, Brax, the LM stack: seconds of imports), which checking a config, or
# running another task, never needs.
def _embodied_run(cfg: Config, console=None):
    import_mjx(warp=uses_warp(cfg))
    from rlinf_jax.tasks.embodied.run import run

    return run(cfg, console)


def _offpolicy_run(cfg: Config, console=None):
    import_mjx(warp=uses_warp(cfg))
    from rlinf_jax.tasks.offpolicy.run import run

    return run(cfg, console)


def _sft_run(cfg: Config, console=None):
    # A VLA clones the tabletop's expert (its simulator imported on this path only); any
    # other kind names no embodied model and the run fine-tunes the language model.
    if cfg.actor.model.kind == "vla":
        import_mjx(warp=False)  # the tabletop steps through MJX's JAX implementation
        from rlinf_jax.tasks.sft.vla import run
    else:
        from rlinf_jax.tasks.sft.run import run_lm as run
    return run(cfg, console)


def _reasoning_run(cfg: Config, console=None):
    from rlinf_jax.tasks.reasoning.run import run

    return run(cfg, console)


def _reasoning_plan(cfg: Config, devices):
    from rlinf_jax.tasks.reasoning.plan import programs

    return programs(cfg, devices)


def _reasoning_remedies(cfg: Config):
    from rlinf_jax.tasks.reasoning.plan import remedies

    return remedies(cfg)


def _sft_plan(cfg: Config, devices):
    from rlinf_jax.tasks.sft.plan import programs

    return programs(cfg, devices)


def _sft_remedies(cfg: Config):
    from rlinf_jax.tasks.sft.plan import remedies

    return remedies(cfg)


def _embodied_plan(cfg: Config, devices):
    # Builds the run's envs (Brax, Playground, the tabletop: their imports) on this path only.
    import_mjx(warp=uses_warp(cfg))
    from rlinf_jax.tasks.embodied.plan import programs

    return programs(cfg, devices)


def _offpolicy_plan(cfg: Config, devices):
    import_mjx(warp=uses_warp(cfg))
    from rlinf_jax.tasks.offpolicy.plan import programs

    return programs(cfg, devices)


def _no_plan(cfg: Config, devices):
    raise BadInput(f"planning a runner.task={cfg.runner.task} run is not supported yet")


def _env_components(cfg: Config) -> tuple[str, ...]:
    from rlinf_jax.flow.stage import COMPONENTS

    return COMPONENTS


@dataclass(frozen=True)
class Task:
    name: str
    # Trains (or resumes) the run; returns a summary whose ``text()`` the CLI prints.
    run: Callable[..., Any]
    # The device components ``cluster.component_placement`` maps for this run.
    components: Callable[[Config], tuple[str, ...]]
    # The config keys the run reads (the others it would ignore), and the checks of values
    # that only the task can judge.
    reads: Callable[[Config], Reads]
    check: Callable[[Config], None]
    article: str = "a"  # as the name is spoken: "an sft run"
    # Fills what the run takes from the files its config names unless the command line set
    # it (the keys in the set): a language model directory's tokenizer.
    resolve: Callable[[Config, set[str]], None] = lambda cfg, overridden: None
    # The iteration's programs on abstract devices, for `python -m rlinf_jax.plan`:
    # ``(cfg, devices) -> (programs, residents, notes)`` (see `rlinf_jax.flow.plan`).
    plan: Callable[[Config, list], tuple] = _no_plan
    # What the planner tries when a run does not fit: ``[(what, {key: value}), ...]``.
    remedies: Callable[[Config], list] = lambda cfg: []

    def describe(self, cfg: Config) -> str:
        kind = cfg.actor.model.kind
        return f"{self.article} {self.name} run" + (f" of actor.model.kind={kind}" if kind != "mlp" else "")


def _sft_components(cfg: Config) -> tuple[str, ...]:
    # A VLA clones on the embodied layout (collocated); a language model has the actor alone.
    return _env_components(cfg) if cfg.actor.model.kind == "vla" else sft_lm.COMPONENTS


TASKS: dict[str, Task] = {
    "embodied": Task(
        "embodied", _embodied_run, _env_components, embodied_config.reads, embodied_config.check,
        "an", plan=_embodied_plan,
    ),
    "offpolicy": Task(
        "offpolicy", _offpolicy_run, _env_components, offpolicy_config.reads,
        offpolicy_config.check, "an", plan=_offpolicy_plan,
    ),
    "sft": Task("sft", _sft_run, _sft_components, sft_config.reads, sft_config.check, "an", sft_config.resolve_lm,
                plan=_sft_plan, remedies=_sft_remedies),
    "reasoning": Task(
        "reasoning", _reasoning_run, reasoning_config.components, reasoning_config.reads, reasoning_config.check,
        resolve=sft_config.resolve_lm, plan=_reasoning_plan, remedies=_reasoning_remedies,
    ),
}


def task_of(cfg: Config) -> Task:
    try:
        return TASKS[cfg.runner.task]
    except KeyError:
        raise BadInput(f"runner.task={cfg.runner.task!r} is unknown; choose one of {', '.join(TASKS)}") from None


def load_run_config(config_name: str, overrides=(), config_dir=None, warn=None) -> Config:
    """The config of a run from a recipe and overrides, checked against what its task reads:
    a key set here that the task would ignore is bad input; keys a base recipe set that it
    ignores are named in one line passed to ``warn``. Values the task takes from the files
    the config names (`Task.resolve`) are filled in first."""
    cfg, origins = compose(config_name, overrides, config_dir)
    task = task_of(cfg)
    task.resolve(cfg, origins.overridden)
    task.check(cfg)
    if len(resolve_seeds(cfg.runner)) > 1 and task.name not in SEED_BATCHES:
        raise BadInput(
            f"runner.seeds / runner.num_seeds train several runs side by side in {' and '.join(SEED_BATCHES)} runs; "
            f"a {task.name} run trains one: remove them"
        )
    note = check_reads(cfg, origins, task.reads(cfg), task.describe(cfg))
    if note is not None and warn is not None:
        warn(note)
    return cfg
