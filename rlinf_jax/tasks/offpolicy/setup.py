"""What an off-policy trainer is built from: the envs, the networks (actor, Q ensemble, and
IQL's V), their optimisers, the replay buffer's shape and the dataset a run learns from
(RLPD's demonstrations, IQL's offline data)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from rlinf_jax import kernels
from rlinf_jax.config.schema import Config
from rlinf_jax.envs import make_env, make_eval_env
from rlinf_jax.envs.base import Env
from rlinf_jax.envs.host.suite import HostEnv, host_spec, is_host_suite
from rlinf_jax.envs.sim_adapter import SimAdapter
from rlinf_jax.errors import BadInput
from rlinf_jax.flow.optim import clipped_adam
from rlinf_jax.policies.offpolicy import QEnsemble, SquashedGaussianActor, ValueMLP
from rlinf_jax.replay import ReplayBuffer, TransitionBatch, read_transitions
from rlinf_jax.runtime.distributed import local_devices_first
from rlinf_jax.sharding import resolve_num_devices
from rlinf_jax.tasks.offpolicy.learner import Learner, Settings


def dataset_command(cfg: Config) -> str:
    """The one command that makes the dataset ``algorithm.offpolicy.demo_path`` names: a PPO expert
    of the run's env trained (unless its run folder already holds it), then its
    transitions collected; for IQL's offline data, half the envs act at random (a known mix
    of good and bad episodes)."""
    a, o, env = cfg.algorithm, cfg.algorithm.offpolicy, cfg.env
    if env.suite == "brax":
        expert = "ppo_brax" + ("" if env.name == "inverted_pendulum" else f" env.name={env.name}")
    else:
        expert = f"RECIPE (a PPO recipe of {env.suite}/{env.name})"
    offline = a.name == "iql"  # its replay buffer holds the dataset
    transitions = min(50_000, o.replay_size) if offline else 20_000
    mix = " --random-fraction 0.5" if offline else ""
    return f"python -m rlinf_jax.collect --expert {expert} --transitions {transitions}{mix} --out {o.demo_path}"


@dataclass
class OffPolicySetup:
    env: Env
    eval_env: Env
    learner: Learner
    actor: Any  # initial parameters (nnx.State)
    critic: Any
    critic_stats: Any
    value: Any  # iql's V parameters; an empty State otherwise
    # The dataset of algorithm.offpolicy.demo_path as host arrays (None: the run has none) and what
    # its file says about itself.
    dataset: TransitionBatch | None = None
    dataset_meta: dict | None = None


def settings(cfg: Config, env: Env) -> Settings:
    a, o = cfg.algorithm, cfg.algorithm.offpolicy
    demo_batch = round(o.batch_size * o.demo_ratio) if a.name == "rlpd" else 0
    if a.name == "rlpd" and not 0 < demo_batch < o.batch_size:
        raise BadInput(
            f"algorithm.offpolicy.demo_ratio={o.demo_ratio} of algorithm.offpolicy.batch_size={o.batch_size} leaves no "
            "room for online or demonstration transitions; pick a ratio that splits the batch"
        )
    return Settings(
        algorithm=a.name,
        num_envs=env.num_envs,
        rollout_length=a.rollout_length,
        utd_ratio=o.utd_ratio,
        batch_size=o.batch_size,
        demo_batch=demo_batch,
        learning_starts=o.learning_starts,
        gamma=a.gamma,
        reward_scale=a.reward_scale,
        tau=o.tau,
        num_min_q=o.num_min_q,
        actor_q_reduce=o.actor_q_reduce,
        learn_alpha=o.learn_alpha,
        target_entropy=o.target_entropy_per_dim * env.action_size,
        policy_delay=o.policy_delay,
        normalize_observations=a.normalize_observations,
        expectile=o.expectile,
        awr_temperature=o.awr_temperature,
        offline_iterations=o.offline_iterations,
    )


def optimizer(lr: float, cfg: Config) -> optax.GradientTransformation:
    o = cfg.actor.optim
    return clipped_adam(lr, o.max_grad_norm, b1=o.b1)


def networks(cfg: Config, obs_size: int, act_size: int, seed: int):
    """Fresh networks seeded with ``seed``: ``(actor graph, params)``, ``(critic graph,
    params, batch statistics)`` and ``(V graph, params)`` (iql's; ``(None, empty)`` else)."""
    a, o, m = cfg.algorithm, cfg.algorithm.offpolicy, cfg.actor.model
    compute = {"dtype": jnp.dtype(m.compute_dtype), "matmul": m.matmul}
    rngs = nnx.Rngs(seed)
    actor = SquashedGaussianActor(obs_size, act_size, m.policy_hidden_sizes, m.activation, m.min_std, rngs=rngs,
                                  **compute)
    critic = QEnsemble(
        obs_size, act_size, m.value_hidden_sizes, o.num_q, m.activation, o.critic_norm, o.renorm_momentum,
        o.renorm_warmup, rngs=rngs, **compute,
    )
    value = (None, nnx.State({}))
    if a.name == "iql":
        value = nnx.split(ValueMLP(obs_size, m.value_hidden_sizes, m.activation, layer_norm=o.critic_norm == "layer",
                                   rngs=rngs))
    return nnx.split(actor), nnx.split(critic, nnx.Param, nnx.BatchStat), value


def seeded(cfg: Config, setup: OffPolicySetup, seed: int) -> OffPolicySetup:
    """``setup`` with fresh networks seeded with ``seed`` (what `make_setup` builds for a
    run whose ``runner.seed`` is ``seed``)."""
    if seed == cfg.runner.seed:
        return setup
    (_, actor), (_, critic, critic_stats), (_, value) = networks(
        cfg, setup.env.observation_size, setup.env.action_size, seed)
    return dataclasses.replace(setup, actor=actor, critic=critic, critic_stats=critic_stats, value=value)


def make_setup(cfg: Config) -> OffPolicySetup:
    """Envs, fresh networks seeded with ``runner.seed``, the learner's static parts and the
    dataset (checked against the env's sizes)."""
    if is_host_suite(cfg.env):
        # Host simulators: sizes now, worker processes when the trainer starts.
        spec = host_spec(cfg.env)
        if spec.camera:
            raise BadInput(f"env.camera={spec.camera} gives structured observations; the off-policy family needs "
                           "flat vectors: set env.camera=\"\"")
        env, eval_env = HostEnv(spec, cfg.env.num_envs), HostEnv(spec, cfg.env.num_eval_envs)
    else:
        with local_devices_first():
            env = make_env(cfg.env)
            eval_env = make_eval_env(cfg.env)
        # Simulator adapters refuse structured observations themselves; others are traced.
        if not isinstance(env.unwrapped, SimAdapter) and jax.tree.structure(
                jax.eval_shape(env.reset, jax.random.PRNGKey(0)).obs).num_leaves != 1:
            raise BadInput(f"env {cfg.env.name} has structured observations; the off-policy family needs flat vectors")
    a, o, m = cfg.algorithm, cfg.algorithm.offpolicy, cfg.actor.model
    obs_size, act_size = env.observation_size, env.action_size
    kernels.check_backend(m.matmul, m.compute_dtype, resolve_num_devices(cfg.cluster.num_devices))
    (actor_graph, actor_params), (critic_graph, critic_params, critic_stats), (value_graph, value_params) = networks(
        cfg, obs_size, act_size, cfg.runner.seed)
    value_tx = optimizer(cfg.actor.optim.critic_lr, cfg) if a.name == "iql" else None
    s = settings(cfg, env)
    buffer = ReplayBuffer(o.replay_size, env.num_envs, s.online_batch if a.name == "rlpd" else o.batch_size)
    dataset = meta = None
    if a.name in ("rlpd", "iql"):
        if not Path(o.demo_path).exists():
            raise BadInput(f"algorithm.offpolicy.demo_path={o.demo_path} does not exist; make it with: {dataset_command(cfg)}")
        dataset, meta = read_transitions(o.demo_path, obs_size, act_size)
        if a.name == "iql" and dataset.size > buffer.capacity:
            raise BadInput(
                f"algorithm.offpolicy.demo_path holds {dataset.size} transitions, more than algorithm.offpolicy.replay_size={o.replay_size} "
                "keeps; iql loads the dataset into the replay buffer: raise algorithm.offpolicy.replay_size"
            )
    if a.name == "iql":
        s = dataclasses.replace(s, preloaded=dataset.size // env.num_envs * env.num_envs)
    learner = Learner(
        settings=s,
        actor_graph=actor_graph,
        critic_graph=critic_graph,
        value_graph=value_graph,
        actor_tx=optimizer(cfg.actor.optim.lr, cfg),
        critic_tx=optimizer(cfg.actor.optim.critic_lr, cfg),
        alpha_tx=optimizer(cfg.actor.optim.lr, cfg),
        value_tx=value_tx,
        buffer=buffer,
    )
    return OffPolicySetup(env, eval_env, learner, actor_params, critic_params, critic_stats, value_params, dataset, meta)
