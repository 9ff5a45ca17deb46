"""What every embodied trainer is built from: the envs, the policy adapter, the model graph
and its initial parameters (after a warm start, when the run has one).

Built once per run, before any trainer: the fused and staged trainers, every layout
auto-placement profiles, and the VLA SFT run all take the same `Setup`, so a warm start
or a model build never happens twice.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from flax import nnx

from rlinf_jax.algos import GROUP_OUTCOME_ADVANTAGES
from rlinf_jax.config.schema import Config
from rlinf_jax.envs import make_env, make_eval_env
from rlinf_jax.envs.base import Env
from rlinf_jax.envs.host.suite import HostEnv, host_spec, is_host_suite
from rlinf_jax.envs.tabletop import SPLITS
from rlinf_jax.errors import BadInput
from rlinf_jax.flow.optim import clipped_adam
from rlinf_jax.policies.embodied import embodied_policy
from rlinf_jax.runtime.distributed import local_devices_first


@dataclass
class Setup:
    env: Env
    eval_env: Env
    policy: Any  # a `rlinf_jax.policies.embodied.EmbodiedPolicy`
    graphdef: Any
    params: Any  # the initial parameters: fresh, or what a warm start returned
    # What a warm start measured (loss, accuracy, ...); None: the run has none. A
    # warm-started policy is evaluated at step 0, the baseline RL's gain is read from.
    warm_start_metrics: dict | None = None
    # Seeds side by side with a warm start: each seed's warm-started parameters, made as
    # that seed's run alone makes them (None: every seed starts from a fresh model).
    seed_params: dict[int, Any] | None = None


def make_setup(cfg: Config, abstract: bool = False) -> Setup:
    """The envs and a fresh model of ``actor.model`` seeded with ``runner.seed``; with
    ``abstract``, the model's parameters as shapes alone (`nnx.eval_shape`: the planner's,
    which allocates no weight)."""
    if is_host_suite(cfg.env):
        # Host simulators: sizes now, worker processes when the trainer starts.
        spec = host_spec(cfg.env)
        env, eval_env = HostEnv(spec, cfg.env.num_envs), HostEnv(spec, cfg.env.num_eval_envs)
    else:
        with local_devices_first():
            env = make_env(cfg.env)
            eval_env = make_eval_env(cfg.env)
    policy = embodied_policy(cfg, env)
    if cfg.algorithm.normalize_observations and not policy.normalizable_observations:
        raise BadInput(
            f"algorithm.normalize_observations=true but actor.model.kind={cfg.actor.model.kind} takes "
            "structured observations; set algorithm.normalize_observations=false"
        )
    build = lambda: policy.build(nnx.Rngs(cfg.runner.seed))  # noqa: E731
    graphdef, params = nnx.split(nnx.eval_shape(build) if abstract else build())
    return Setup(env, eval_env, policy, graphdef, params)


def fresh_params(setup: Setup, seed: int):
    """A fresh model's parameters seeded with ``seed`` (what `make_setup` builds for a run
    whose ``runner.seed`` is ``seed``)."""
    return nnx.split(setup.policy.build(nnx.Rngs(seed)))[1]


def substeps(cfg: Config, env: Env) -> int:
    """Simulator steps per policy step: repeated actions, or the sub-steps of a chunk."""
    return cfg.env.action_repeat * int(getattr(env.unwrapped, "chunk_length", 1))


def optimizer(cfg: Config):
    """PPO's optimiser; a linear schedule decays over every minibatch update of the run."""
    o, a = cfg.actor.optim, cfg.algorithm
    total_updates = cfg.runner.max_steps * a.update_epochs * a.num_minibatches
    return clipped_adam(o.lr, o.max_grad_norm, o.lr_schedule, total_updates)


def group_size(cfg: Config, env: Env) -> int:
    """Group advantages (GRPO and kin) on an env: every env runs exactly one episode per
    iteration, and the ``env.group_size`` envs of a group share its reset, so an episode's
    return is compared with its group's. 0 when the estimator is GAE-like."""
    a = cfg.algorithm
    if a.adv_type not in GROUP_OUTCOME_ADVANTAGES:
        return 0
    g = cfg.env.group_size
    if g < 2 or env.num_envs % g:
        raise BadInput(
            f"algorithm.adv_type={a.adv_type} compares episodes within groups: set env.group_size >= 2 "
            f"dividing env.num_envs={env.num_envs} (got {g})"
        )
    n = substeps(cfg, env)
    e = cfg.env
    if a.rollout_length * n != e.episode_length or e.reset_mode != "fresh" or e.terminate_on_success:
        # An episode that ended early would be followed by a new one inside the same
        # iteration, and its return would mix the two.
        raise BadInput(
            f"algorithm.adv_type={a.adv_type} needs one whole episode per env per iteration: set "
            f"algorithm.rollout_length x sub-steps per step ({a.rollout_length} x {n}) equal to "
            f"env.episode_length={e.episode_length}, env.reset_mode=fresh and env.terminate_on_success=false"
        )
    return g


def split_eval_envs(cfg: Config) -> dict[str, Env]:
    """One eval env per split of a benchmark that has them (the tabletop: train, vision,
    semantic, execution), else none."""
    if cfg.env.suite != "tabletop":
        return {}
    return {split: make_eval_env(dataclasses.replace(cfg.env, name=split)) for split in SPLITS}
