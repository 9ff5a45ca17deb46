"""Embodied PPO as pure functions: one iteration is a rollout of the env batch, values and
advantages in one batched pass, then ``update_epochs`` epochs of clipped PPO over shuffled
minibatches.

Everything here is a function of its arguments (Brax's ``losses.py`` style): the static
parts (policy adapter, model graph, optimiser, numbers from the config) travel as one
`Learner`, the arrays as a `TrainState`. The fused trainer jits `run_chunk`; the staged
runner's actor stage calls `learn` itself, which is why the two agree number for number.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from rlinf_jax.algos import entropy_bonus, value_loss
from rlinf_jax.config.schema import Config
from rlinf_jax.envs import normalization
from rlinf_jax.envs.base import Env
from rlinf_jax.flow.optim import finite, guarded_update, select
from rlinf_jax.rollout import Transition, unroll
from rlinf_jax.sharding.mesh import fetch
from rlinf_jax.tasks.embodied.state import TrainState

# Metrics summed over a chunk and reported as ratios of two sums, not as means.
EPISODE_SUMS = ("env/return_sum", "env/length_sum", "env/success_sum", "env/episodes")


@dataclass(frozen=True)
class PPOSettings:
    """The numbers of ``cfg.algorithm`` (and the batch shape) that PPO's maths reads."""

    rollout_length: int
    update_epochs: int
    num_minibatches: int
    batch_size: int  # env.num_envs * rollout_length
    gamma: float
    gae_lambda: float
    clip_eps: float
    entropy_coef: float
    value_coef: float
    reward_scale: float
    normalize_advantages: bool
    normalize_observations: bool
    bootstrap_on_truncation: bool
    # Envs per group for group advantages (GRPO and kin, one episode per env); 0: GAE-like.
    group_size: int
    # At most this many time-limit truncations per iteration (see `final_values`).
    max_truncations: int

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @classmethod
    def from_config(cls, cfg: Config, num_envs: int, substeps: int, group_size: int) -> PPOSettings:
        a = cfg.algorithm
        T = a.rollout_length
        return cls(
            rollout_length=T,
            update_epochs=a.update_epochs,
            num_minibatches=a.num_minibatches,
            batch_size=num_envs * T,
            gamma=a.gamma,
            gae_lambda=a.gae_lambda,
            clip_eps=a.clip_eps,
            entropy_coef=a.entropy_coef,
            value_coef=a.value_coef,
            reward_scale=a.reward_scale,
            normalize_advantages=a.normalize_advantages,
            normalize_observations=a.normalize_observations,
            bootstrap_on_truncation=a.bootstrap_on_truncation,
            group_size=group_size,
            max_truncations=max_truncations(T, num_envs, cfg.env.episode_length, substeps),
        )


@dataclass(frozen=True)
class Learner:
    """The static parts of PPO's update: closed over by the jitted programs, never traced."""

    policy: Any  # a `rlinf_jax.policies.embodied.EmbodiedPolicy`
    graphdef: Any  # the model's nnx graph
    tx: optax.GradientTransformation
    settings: PPOSettings
    advantage_fn: Callable
    policy_loss_fn: Callable
    # Minibatches split over the actor's batch axes when they divide (None: left to XLA).
    minibatch_sharding: Any = None

    def model(self, params) -> nnx.Module:
        return nnx.merge(self.graphdef, params)


def max_truncations(rollout_length: int, num_envs: int, episode_length: int, substeps: int) -> int:
    """A time limit truncates an env at most once per ``episode_length`` sub-steps, so an
    iteration of ``rollout_length`` policy steps holds at most ``B * ceil(T / steps per
    episode)`` truncations."""
    steps_per_episode = max(1, -(-episode_length // substeps))  # ceil
    return min(rollout_length * num_envs, num_envs * -(-rollout_length // steps_per_episode))


def normalize(settings: PPOSettings, stats, obs):
    return normalization.normalize(stats, obs) if settings.normalize_observations else obs


def acting(learner: Learner, params, stats):
    """``(obs, per-env keys) -> (action, raw_action, logprob[, value])``: what the rollout
    runs; the value where the policy's acting pass yields it (``act_with_value``)."""
    model = learner.model(params)
    act = getattr(learner.policy, "act_with_value", learner.policy.act)
    return lambda obs, keys: act(model, normalize(learner.settings, stats, obs), keys)


def final_values(critic, traj: Transition, k: int) -> jax.Array:
    """V(final observation) ``[T * B]`` where an episode was truncated (0 elsewhere).

    The critic runs on the (at most ``k``, see `max_truncations`) truncated rows only,
    gathered, instead of on all ``T x B`` final observations. Should a batch ever hold
    more, the full pass runs instead; with none, no pass at all.
    """
    T, B = traj.reward.shape
    trunc = traj.truncated.reshape(T * B) > 0
    count = jnp.sum(trunc)
    flat_final = jax.tree.map(lambda x: x.reshape(T * B, *x.shape[2:]), traj.final_obs)
    zeros = jnp.zeros((T * B,), traj.reward.dtype)

    def gathered(o):
        (rows,) = jnp.nonzero(trunc, size=k, fill_value=0)
        v = critic(jax.tree.map(lambda x: x[rows], o))
        return zeros.at[rows].add(jnp.where(trunc[rows], v, 0.0))  # padding rows add 0

    def branch(o):
        return jax.lax.cond(count <= k, gathered, lambda o: jnp.where(trunc, critic(o), 0.0), o)

    return jax.lax.cond(count > 0, branch, lambda o: zeros, flat_final)


def advantages(learner: Learner, model, stats, traj: Transition, last_obs):
    """``(advantages, returns, values)``, each ``[T, B]``, gradients stopped."""
    s = learner.settings
    T, B = traj.reward.shape
    if s.group_size:
        # One episode per env: its return against its group's (no critic involved).
        episode_return = jnp.sum(traj.reward * s.reward_scale, axis=0)
        adv = learner.advantage_fn(episode_return, s.group_size)
        zeros = jnp.zeros((T, B), traj.reward.dtype)
        return zeros + adv[None], zeros + episode_return[None], zeros
    flat = lambda tree: jax.tree.map(lambda x: x.reshape(T * B, *x.shape[2:]), tree)  # noqa: E731
    critic = lambda o: learner.policy.critic(model, normalize(s, stats, o))  # noqa: E731
    if traj.value is not None:  # recorded by the rollout's acting pass
        values, last_value = traj.value, critic(last_obs)
    else:
        v = critic(jax.tree.map(lambda a, b: jnp.concatenate([a, b]), flat(traj.obs), last_obs))
        values, last_value = v[: T * B].reshape(T, B), v[T * B :]
    truncations = finals = None
    if s.bootstrap_on_truncation:
        truncations = traj.truncated
        finals = final_values(critic, traj, s.max_truncations).reshape(T, B)
    rewards = traj.reward * s.reward_scale
    adv, ret = learner.advantage_fn(rewards, values, traj.done, last_value, s.gamma, s.gae_lambda, truncations, finals)
    return jax.lax.stop_gradient(adv), jax.lax.stop_gradient(ret), values


def loss(learner: Learner, params, stats, batch: dict, key):
    """PPO's clipped objective plus the value loss and the entropy bonus on one minibatch."""
    s = learner.settings
    model = learner.model(params)
    obs = normalize(s, stats, batch["obs"])
    logprob, entropy, value = learner.policy.evaluate_actions(model, obs, batch["raw_action"], key)
    adv = batch["advantage"]
    if s.normalize_advantages:
        adv = (adv - jnp.mean(adv)) / (jnp.std(adv) + 1e-8)
    # Log-probs finer than a step (a VLA's per-action or per-token level, [N, k]): the
    # step's advantage applies to each of its k ratios.
    adv = jnp.broadcast_to(adv.reshape(adv.shape + (1,) * (logprob.ndim - 1)), logprob.shape)
    pg_loss, pg_metrics = learner.policy_loss_fn(logprob, batch["logprob"], adv, clip_low=s.clip_eps, clip_high=s.clip_eps)
    v_loss = value_loss(value, None, batch["return"])
    ent = entropy_bonus(entropy)
    total = pg_loss + s.value_coef * v_loss - s.entropy_coef * ent
    return total, {
        "train/total_loss": total,
        "train/policy_loss": pg_loss,
        "train/value_loss": v_loss,
        "train/entropy": ent,
        "train/approx_kl": pg_metrics["approx_kl"],
        "train/clip_frac": pg_metrics["clip_fraction"],
    }


def update(learner: Learner, params, opt_state, stats, traj: Transition, adv, ret, key):
    """``update_epochs`` epochs of minibatch steps; returns params, optimiser state and the
    means of the metrics over the updates that were taken (skipped ones are counted)."""
    s = learner.settings
    flat = {"obs": traj.obs, "raw_action": traj.raw_action, "logprob": traj.logprob, "advantage": adv, "return": ret}
    flat = jax.tree.map(lambda x: x.reshape(s.batch_size, *x.shape[2:]), flat)
    grad_fn = jax.value_and_grad(lambda p, b, k: loss(learner, p, stats, b, k), has_aux=True)

    def sgd_step(carry, minibatch):
        params, opt_state, k = carry
        k, loss_key = jax.random.split(k)
        (total, metrics), grads = grad_fn(params, minibatch, loss_key)
        params, opt_state, ok = guarded_update(learner.tx, grads, params, opt_state, total)
        metrics = jax.tree.map(lambda x: jnp.where(ok, x, 0.0), metrics)
        metrics["train/grad_norm"] = jnp.where(ok, optax.tree.norm(grads), 0.0)
        metrics["train/ok_updates"] = ok.astype(jnp.float32)
        return (params, opt_state, k), metrics

    def epoch(carry, epoch_key):
        perm = jax.random.permutation(epoch_key, s.batch_size)
        shuffled = jax.tree.map(lambda x: x[perm].reshape(s.num_minibatches, s.minibatch_size, *x.shape[1:]), flat)
        if learner.minibatch_sharding is not None:
            shuffled = jax.lax.with_sharding_constraint(shuffled, learner.minibatch_sharding)
        return jax.lax.scan(sgd_step, carry, shuffled)

    key, step_key = jax.random.split(key)
    (params, opt_state, _), metrics = jax.lax.scan(
        epoch, (params, opt_state, step_key), jax.random.split(key, s.update_epochs)
    )
    ok = metrics.pop("train/ok_updates")
    n_ok = jnp.sum(ok)
    means = {k: jnp.sum(v) / jnp.maximum(n_ok, 1.0) for k, v in metrics.items()}
    means["train/skipped_updates"] = ok.size - n_ok
    return params, opt_state, means


def learn(learner: Learner, ts: TrainState, traj: Transition, last_obs, key):
    """The actor's half of an iteration: values, advantages, PPO epochs, statistics.

    Pure in (learner state, trajectory); ``ts.env_state`` is not read, ``ts.key`` is
    passed through.
    """
    s = learner.settings
    adv, ret, values = advantages(learner, learner.model(ts.params), ts.obs_stats, traj, last_obs)
    params, opt_state, train_metrics = update(learner, ts.params, ts.opt_state, ts.obs_stats, traj, adv, ret, key)

    # Statistics move after the update, so the update saw exactly what the policy saw.
    obs_stats = ts.obs_stats
    if s.normalize_observations:
        updated = normalization.update_stats(obs_stats, traj.obs)
        obs_stats = select(finite(traj.obs), updated, obs_stats)

    skipped = train_metrics["train/skipped_updates"]
    ts = ts.replace(
        params=params,
        opt_state=opt_state,
        obs_stats=obs_stats,
        step=ts.step + 1,
        bad_iterations=jnp.where(skipped > 0, ts.bad_iterations + 1, 0),
    )
    done = traj.done
    metrics = {
        **train_metrics,
        "train/value_mean": jnp.mean(values),
        "train/advantage_std": jnp.std(adv),
        "rollout/reward_mean": jnp.mean(traj.reward),
        "rollout/truncation_rate": jnp.sum(traj.truncated) / jnp.maximum(jnp.sum(done), 1.0),
        "env/return_sum": jnp.sum(traj.episode_return * done),
        "env/length_sum": jnp.sum(traj.episode_length * done),
        "env/success_sum": jnp.sum(traj.episode_success * done),
        "env/episodes": jnp.sum(done),
    }
    return ts, metrics


def iteration(env: Env, learner: Learner, ts: TrainState):
    """One whole iteration: unroll the env batch with the current policy, then `learn`."""
    key, rollout_key, update_key = jax.random.split(ts.key, 3)
    policy = acting(learner, ts.params, ts.obs_stats)
    env_state, traj = unroll(env, policy, ts.env_state, rollout_key, learner.settings.rollout_length)
    ts, metrics = learn(learner, ts.replace(env_state=None), traj, env_state.obs, update_key)
    return ts.replace(env_state=env_state, key=key), metrics


def run_chunk(env: Env, learner: Learner, ts: TrainState, num_iterations):
    """``num_iterations`` iterations (a traced int: one compile for every chunk length);
    returns the state and the metrics summed over them."""
    # One jitted function for both uses below: the loop body reuses the trace that gave the
    # metrics' shapes (tracing a Brax env's step is most of a cached run's start).
    step = jax.jit(functools.partial(iteration, env, learner))
    shapes = jax.eval_shape(step, ts)[1]
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    def body(i, carry):
        ts, sums = carry
        ts, metrics = step(ts)
        return ts, jax.tree.map(jnp.add, sums, metrics)

    return jax.lax.fori_loop(0, num_iterations, body, (ts, zeros))


def summarize(sums: dict, num_iterations: int, substeps: int, has_success: bool) -> dict[str, float]:
    """A chunk's summed metrics -> per-iteration means and episode averages (host floats)."""
    sums = {k: float(v) for k, v in fetch(sums).items()}
    out = {k: v / num_iterations for k, v in sums.items() if k not in EPISODE_SUMS}
    out["train/skipped_updates"] = sums["train/skipped_updates"]
    episodes = sums["env/episodes"]
    if episodes > 0:
        out["env/return"] = sums["env/return_sum"] / episodes
        out["env/episode_length"] = sums["env/length_sum"] / episodes * substeps
        if has_success:
            out["env/success"] = sums["env/success_sum"] / episodes
    out["env/episodes"] = episodes
    return out
