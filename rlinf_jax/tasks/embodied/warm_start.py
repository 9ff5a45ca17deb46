"""Warm starts of an embodied run: parameters that RL starts from instead of a fresh model.

They run once, before any trainer is built, and return a new `Setup` (its ``params`` and
the ``warm_start_metrics`` logged at step 0):

- ``actor.model.path`` (VLA): the parameters of a ``sft_vla_tabletop`` run (`load_sft_params`);
- ``sft.warm_start_steps > 0``: behaviour cloning of the tabletop's scripted expert (VLA,
  optionally with DAgger rounds) or flow matching on its chunks (pi0);
- then, for a VLA trained with a critic, the critic warm-up (``sft.critic_warmup_steps``).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from rlinf_jax.algos import GROUP_OUTCOME_ADVANTAGES
from rlinf_jax.config import load_config_file
from rlinf_jax.config.schema import Config
from rlinf_jax.errors import BadInput
from rlinf_jax.envs.tabletop.visits import expert_demos
from rlinf_jax.flow.seeds import combine
from rlinf_jax.runtime import find_checkpoint, restore_checkpoint
from rlinf_jax.tasks.embodied import cloning
from rlinf_jax.tasks.embodied.setup import Setup, fresh_params, make_setup
from rlinf_jax.tasks.embodied.state import fresh_state


def warm_start(cfg: Config, setup: Setup, log=print) -> Setup:
    """``setup`` with the parameters the run starts RL from (unchanged without a warm start)."""
    m = cfg.actor.model
    if m.kind == "vla" and m.path:
        params = load_sft_params(cfg, setup.params)
        metrics: dict = {}  # evaluated at step 0 like a warm start
        return dataclasses.replace(setup, params=critic_warmup(cfg, setup, params, metrics, log), warm_start_metrics=metrics)
    if cfg.sft.warm_start_steps > 0 and m.kind in CLONES:
        return CLONES[m.kind](cfg, setup, log)
    return setup


def warm_start_runs(cfg: Config, setup: Setup, seeds: Sequence[int], log=print) -> Setup:
    """`warm_start` for the runs of ``seeds`` side by side: each seed's warm start made as
    that seed's run alone makes it (its own fresh model, demonstrations, cloning and
    critic keys), so each run starts where it would alone; their metrics are combined
    over the seeds (`flow.seeds.combine`). One seed: `warm_start` itself."""
    if len(seeds) == 1:
        return warm_start(cfg, setup, log)
    made = []
    for seed in seeds:
        run_cfg = copy.deepcopy(cfg)
        run_cfg.runner.seed = seed
        params = setup.params if seed == cfg.runner.seed else fresh_params(setup, seed)
        seed_log = None if log is None else (lambda line, seed=seed: log(f"seed {seed}: {line}"))
        run = warm_start(run_cfg, dataclasses.replace(setup, params=params), seed_log)
        if run.warm_start_metrics is None:  # no warm start: every seed starts from its fresh model
            return setup
        made.append(run)
    return dataclasses.replace(
        setup, seed_params={seed: m.params for seed, m in zip(seeds, made)},
        warm_start_metrics=combine([m.warm_start_metrics for m in made], seeds),
    )


def _fit_args(cfg: Config, log) -> dict:
    s = cfg.sft
    return dict(steps=s.warm_start_steps, lr=s.lr, batch_size=s.batch_size, seed=cfg.runner.seed, log=log)


def clone_vla(cfg: Config, setup: Setup, log) -> Setup:
    """Behaviour cloning of the expert's chunks, with DAgger rounds when asked; then the
    critic warm-up."""
    s = cfg.sft
    data = expert_demos(setup.env, s.num_demos, cfg.runner.seed)
    if s.dagger_rounds > 0:  # cloning, then rounds on the policy's own states
        params, hist = cloning.dagger_clone(
            setup.policy, setup.graphdef, setup.params, setup.env, data, rounds=s.dagger_rounds,
            episodes=s.dagger_episodes, round_steps=s.dagger_steps, **_fit_args(cfg, log),
        )
        metrics = {
            "warm_start/loss": hist["loss"][-1],
            "warm_start/bin_accuracy": hist["accuracy"][-1],
            "warm_start/dagger_success": hist["success"][-1],
        }
    else:
        params, loss, acc = cloning.behaviour_clone(setup.policy, setup.graphdef, setup.params, data, **_fit_args(cfg, log))
        metrics = {"warm_start/loss": float(loss[-1]), "warm_start/bin_accuracy": float(acc[-1])}
    params = critic_warmup(cfg, setup, params, metrics, log)
    return dataclasses.replace(setup, params=params, warm_start_metrics=metrics)


def clone_pi0(cfg: Config, setup: Setup, log) -> Setup:
    """Flow matching on the expert's chunks, pi0's (pi0.5's, GR00T's) own pre-training
    objective; then the critic warm-up."""
    data = expert_demos(setup.env, cfg.sft.num_demos, cfg.runner.seed)
    params, loss, error = cloning.flow_matching_clone(setup.policy, setup.graphdef, setup.params, data, **_fit_args(cfg, log))
    metrics = {"warm_start/loss": float(loss[-1]), "warm_start/action_error": error}
    params = critic_warmup(cfg, setup, params, metrics, log)
    return dataclasses.replace(setup, params=params, warm_start_metrics=metrics)


CLONES = {"vla": clone_vla, "pi0": clone_pi0, "pi05": clone_pi0, "gr00t": clone_pi0}


def critic_warmup(cfg: Config, setup: Setup, params, metrics: dict, log):
    """The value head fitted to the warm-started policy's returns (`cloning.fit_value_head`),
    when ``sft.critic_warmup_steps`` > 0 and the run has a critic; the policy itself is
    untouched. Adds ``warm_start/value_mse`` to ``metrics``."""
    s, a = cfg.sft, cfg.algorithm
    if s.critic_warmup_steps <= 0 or a.adv_type in GROUP_OUTCOME_ADVANTAGES:  # group advantages use no critic
        return params
    params, err = cloning.fit_value_head(
        setup.policy, setup.graphdef, params, setup.env, episodes=s.critic_warmup_episodes,
        steps=s.critic_warmup_steps, lr=s.lr, batch_size=s.batch_size, gamma=a.gamma,
        reward_scale=a.reward_scale, seed=cfg.runner.seed, log=log,
    )
    metrics["warm_start/value_mse"] = err
    return params


def load_sft_params(cfg: Config, params):
    """The parameters of the SFT run or checkpoint ``actor.model.path`` names, for a model
    shaped like ``params``. The checkpoint is read onto a state built from that run's own
    config.yaml (its env batch may differ from this run's); a model of other sizes, or a
    path that is no VLA SFT run, is bad input."""
    given = cfg.actor.model.path
    point = find_checkpoint(given, "actor.model.path")
    config_path = Path(point.directory).parent / "config.yaml"
    if not config_path.is_file():
        raise BadInput(f"actor.model.path={given!r}: {config_path} is missing; point it at a sft_vla_tabletop run folder")
    saved_cfg = load_config_file(config_path, [])
    if saved_cfg.actor.model.kind != cfg.actor.model.kind or saved_cfg.runner.task != "sft":
        raise BadInput(
            f"actor.model.path={given!r} is a runner.task={saved_cfg.runner.task} run of actor.model.kind="
            f"{saved_cfg.actor.model.kind}; a {cfg.actor.model.kind} RL run starts from a runner.task=sft run of that kind"
        )
    saved = make_setup(saved_cfg)
    template = fresh_state(
        saved_cfg.runner.seed, saved.env, saved.policy.normalizable_observations, saved.params,
        cloning.sft_optimizer(saved_cfg),
    )
    restored, _ = restore_checkpoint(point, jax.device_get(template), keep=saved_cfg.runner.keep_checkpoints)
    shapes = lambda tree: jax.tree.map(lambda x: tuple(np.shape(x)), tree)  # noqa: E731
    if shapes(restored.params) != shapes(params):
        raise BadInput(
            f"actor.model.path={given!r} holds a model of other sizes than actor.model.* describes; "
            "use the SFT run's actor.model settings"
        )
    return jax.tree.map(lambda x: jnp.asarray(np.asarray(x)), restored.params)
