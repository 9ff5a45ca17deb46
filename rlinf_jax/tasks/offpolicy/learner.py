"""The off-policy family as pure functions: acting, one batched env step into the replay
buffer, one gradient step of SAC / CrossQ / RLPD / IQL, and an iteration of ``T`` env
steps each followed by ``utd_ratio`` gradient steps.

Everything is a function of its arguments: the static parts (model graphs, optimisers,
the buffer's shape, numbers from the config) travel as one `Learner`, the arrays as an
`OffPolicyState`, the demonstrations (RLPD) as an argument. The fused trainer jits
`run_chunk`, a whole chunk of iterations in one program.

Algorithms, in terms of the losses in `rlinf_jax.algos.offpolicy`:
- sac: twin (or ``num_q``) critics regress on the soft target of Polyak-averaged target
  critics; the actor and the temperature step every ``policy_delay`` critic steps.
- crossq: no target critics; the critic sees the current and the next (state, action)
  pairs in one forward pass in training mode (batch renormalisation over both), and the
  target is that pass's next-state values with gradients stopped.
- rlpd: sac whose batches are half online transitions, half demonstrations
  (``demo_ratio``); with RLPD's recipe also LayerNorm critics, a 10-critic ensemble whose
  target minimum runs over 2 random members (REDQ) and a high ``utd_ratio``.
- iql: V regresses on an expectile of the target critics' Q of dataset actions, Q on
  ``r + gamma V(s')``, the actor on advantage-weighted log-likelihood; the dataset is
  loaded into the replay buffer first, so online fine-tuning continues on dataset and
  new transitions alike.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from rlinf_jax.algos import offpolicy as op
from rlinf_jax.array_types import Array, Count, Float, Key
from rlinf_jax.envs import normalization
from rlinf_jax.envs.base import Env
from rlinf_jax.flow.optim import finite, guarded_update, select
from rlinf_jax.policies.offpolicy import deterministic_action, action_logprob, sample_action
from rlinf_jax.replay import ReplayBuffer, TransitionBatch, TransitionDataset
from rlinf_jax.replay.buffer import concat_batches
from rlinf_jax.rollout import env_keys, step_keys
from rlinf_jax.sharding.mesh import fetch

# Metrics summed over a chunk and reported as ratios of two sums, not as means.
EPISODE_SUMS = ("env/return_sum", "env/length_sum", "env/episodes")


@dataclass(frozen=True)
class Settings:
    algorithm: str  # sac | crossq | rlpd | iql
    num_envs: int
    rollout_length: int  # batched env steps per iteration
    utd_ratio: int  # gradient steps per batched env step
    batch_size: int
    demo_batch: int  # of batch_size, the transitions drawn from the demonstrations (rlpd)
    learning_starts: int
    gamma: float
    reward_scale: float
    tau: float
    num_min_q: int
    actor_q_reduce: str
    learn_alpha: bool
    target_entropy: float
    policy_delay: int
    normalize_observations: bool
    expectile: float
    awr_temperature: float
    offline_iterations: int
    preloaded: int = 0  # transitions in the buffer before the first env step (iql's dataset)

    @property
    def has_target(self) -> bool:
        return self.algorithm != "crossq"

    @property
    def online_batch(self) -> int:
        return self.batch_size - self.demo_batch


@dataclass(frozen=True)
class Learner:
    """The static parts: closed over by the jitted programs, never traced."""

    settings: Settings
    actor_graph: Any
    critic_graph: Any
    value_graph: Any  # iql's V; None otherwise
    actor_tx: optax.GradientTransformation
    critic_tx: optax.GradientTransformation
    alpha_tx: optax.GradientTransformation
    value_tx: optax.GradientTransformation | None
    buffer: ReplayBuffer
    # Where a sampled batch lives: replicated over the learner's devices, so that every
    # device runs the same gradient step and the numbers do not depend on the device count
    # (a batch of a few hundred rows gains nothing from being split). None: left to XLA.
    batch_sharding: Any = None


@struct.dataclass
class OffPolicyState:
    actor: Any
    critic: Any
    critic_stats: Any  # batch renormalisation's running statistics (an empty State otherwise)
    target_critic: Any  # Polyak-averaged critic parameters (an empty State for crossq)
    value: Any  # iql's V (an empty State otherwise)
    log_alpha: Float[Array, "*runs"]
    actor_opt: Any
    critic_opt: Any
    alpha_opt: Any
    value_opt: Any
    obs_stats: normalization.RunningStats
    env_state: Any
    replay: Any
    key: Key
    step: Count  # iterations done
    env_steps: Count  # batched env steps done (decides the random warm-up)
    grad_steps: Count  # gradient steps done (the policy delay counts them)
    bad_iterations: Count
    # The actor parameters and observation statistics the rollout acts with in the next
    # iteration: the newest ones, except with flow.max_staleness=1 in a staged layout,
    # where the rollout runs one iteration behind the learner (see `staged`).
    rollout_actor: Any
    rollout_stats: normalization.RunningStats


# ------------------------------------------------------------------ networks as functions


def normalize(learner: Learner, stats, obs):
    return normalization.normalize(stats, obs) if learner.settings.normalize_observations else obs


def actor_model(learner: Learner, params):
    return nnx.merge(learner.actor_graph, params)


def q_values(learner: Learner, params, stats, obs, action, train: bool = False):
    """``(Q [N, B], batch statistics after the pass)``; training mode moves them."""
    # copy=True: fresh Variables at this trace level, which a training pass may update.
    model = nnx.merge(learner.critic_graph, params, stats, copy=True)
    q = model(obs, action, train=train)
    return q, nnx.state(model, nnx.BatchStat)


def value_fn(learner: Learner, params, obs):
    return nnx.merge(learner.value_graph, params)(obs)


def acting(learner: Learner, actor_params, stats) -> Callable:
    """``(obs, per-env keys) -> env action``: a sample of the current policy."""
    actor = actor_model(learner, actor_params)
    return lambda obs, keys: sample_action(actor, normalize(learner, stats, obs), keys)[0]


def greedy(learner: Learner, actor_params, stats) -> Callable:
    """``obs -> action``: the policy's mode, for evaluation."""
    actor = actor_model(learner, actor_params)
    return lambda obs: deterministic_action(actor, normalize(learner, stats, obs))


# ------------------------------------------------------------------ gradient steps


def _guarded(tx, loss_fn, params, opt_state, has_aux=True):
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=has_aux)(params)
    params, opt_state, ok = guarded_update(tx, grads, params, opt_state, loss)
    return params, opt_state, ok, loss, aux, optax.tree.norm(grads)


def _sac_critic_step(learner: Learner, ts: OffPolicyState, batch: TransitionBatch, key):
    s = learner.settings
    k_next, k_subset = jax.random.split(key)
    actor = actor_model(learner, ts.actor)
    alpha = jnp.exp(ts.log_alpha)
    next_action, next_logp = sample_action(actor, batch.next_obs, k_next)
    reward = batch.reward * s.reward_scale

    if s.has_target:
        target_q, _ = q_values(learner, ts.target_critic, ts.critic_stats, batch.next_obs, next_action)
        y = op.soft_q_target(reward, batch.terminated, op.ensemble_min(target_q, k_subset, s.num_min_q), next_logp,
                             alpha, s.gamma)

        def loss(params):
            q, stats = q_values(learner, params, ts.critic_stats, batch.obs, batch.action)
            return op.ensemble_regression(q, y), (stats, q, y)
    else:
        # CrossQ: current and next pairs share one training-mode pass (and its batch
        # statistics); the next half gives the target, held fixed.
        def loss(params):
            both, stats = q_values(
                learner, params, ts.critic_stats, jnp.concatenate([batch.obs, batch.next_obs]),
                jnp.concatenate([batch.action, next_action]), train=True,
            )
            q, next_q = jnp.split(both, 2, axis=1)
            next_q = op.ensemble_min(jax.lax.stop_gradient(next_q), k_subset, s.num_min_q)
            y = op.soft_q_target(reward, batch.terminated, next_q, next_logp, alpha, s.gamma)
            return op.ensemble_regression(q, y), (stats, q, y)

    critic, critic_opt, ok, c_loss, (stats, q, y), gnorm = _guarded(learner.critic_tx, loss, ts.critic, ts.critic_opt)
    stats = select(ok, stats, ts.critic_stats)
    target = op.polyak(ts.target_critic, critic, s.tau) if s.has_target else ts.target_critic
    ts = ts.replace(critic=critic, critic_opt=critic_opt, critic_stats=stats, target_critic=target)
    metrics = {"train/critic_loss": c_loss, "train/q_mean": jnp.mean(q), "train/target_q_mean": jnp.mean(y),
               "train/critic_grad_norm": gnorm}
    return ts, ok, metrics


def _sac_actor_step(learner: Learner, ts: OffPolicyState, batch: TransitionBatch, key):
    s = learner.settings
    alpha = jnp.exp(ts.log_alpha)

    def loss(params):
        action, logp = sample_action(actor_model(learner, params), batch.obs, key)
        q, _ = q_values(learner, ts.critic, ts.critic_stats, batch.obs, action)
        return op.actor_loss(logp, q, alpha, s.actor_q_reduce), logp

    actor, actor_opt, ok, a_loss, logp, _ = _guarded(learner.actor_tx, loss, ts.actor, ts.actor_opt)
    log_alpha, alpha_opt, alpha_ok = ts.log_alpha, ts.alpha_opt, jnp.array(True)
    if s.learn_alpha:
        log_alpha, alpha_opt, alpha_ok, _, _, _ = _guarded(
            learner.alpha_tx, lambda la: (op.temperature_loss(la, logp, s.target_entropy), None), ts.log_alpha,
            ts.alpha_opt,
        )
    ts = ts.replace(actor=actor, actor_opt=actor_opt, log_alpha=log_alpha, alpha_opt=alpha_opt)
    metrics = {"train/actor_loss": a_loss, "train/entropy": -jnp.mean(logp), "train/alpha": jnp.exp(log_alpha)}
    return ts, ok & alpha_ok, metrics


def sac_step(learner: Learner, ts: OffPolicyState, batch: TransitionBatch, key):
    """One critic step and, every ``policy_delay`` steps, one actor and temperature step.
    Returns ``(state, ok, metrics)``; a non-finite update is skipped whole (see
    `rlinf_jax.flow.optim.guarded_update`).

    SAC's actor reads the critic as it was before this step's critic update (Brax's order:
    both updates read one state, so they are independent and may run side by side);
    CrossQ's reads the updated critic and its new batch statistics, as its reference code.
    """
    s = learner.settings
    k_critic, k_actor = jax.random.split(key)
    after, critic_ok, metrics = _sac_critic_step(learner, ts, batch, k_critic)
    read = ts if s.has_target else after

    def actor_turn(read):
        return _sac_actor_step(learner, read, batch, k_actor)

    if s.policy_delay == 1:
        actor_state, actor_ok, a_metrics = actor_turn(read)
        turn = jnp.array(True)
    else:
        def skip(read):
            # Zeros: these metrics are averaged over the actor's turns only (`summarize`).
            zero = jnp.zeros((), jnp.float32)
            return read, jnp.array(True), {"train/actor_loss": zero, "train/entropy": zero, "train/alpha": zero}

        turn = (ts.grad_steps % s.policy_delay) == 0
        actor_state, actor_ok, a_metrics = jax.lax.cond(turn, actor_turn, skip, read)
    ts = after.replace(actor=actor_state.actor, actor_opt=actor_state.actor_opt, log_alpha=actor_state.log_alpha,
                       alpha_opt=actor_state.alpha_opt)
    metrics.update(a_metrics)
    metrics["train/actor_updates"] = turn.astype(jnp.float32)
    return ts, critic_ok & actor_ok, metrics


def iql_step(learner: Learner, ts: OffPolicyState, batch: TransitionBatch, key):
    """IQL's value, actor and critic steps (in the authors' order), then the target critics."""
    s = learner.settings
    target_q, _ = q_values(learner, ts.target_critic, ts.critic_stats, batch.obs, batch.action)
    target_q = jnp.min(target_q, axis=0)

    def v_loss(params):
        v = value_fn(learner, params, batch.obs)
        return op.iql_value_loss(target_q, v, s.expectile), v

    value, value_opt, v_ok, v_loss_val, v, _ = _guarded(learner.value_tx, v_loss, ts.value, ts.value_opt)
    advantage = target_q - value_fn(learner, value, batch.obs)

    def pi_loss(params):
        logp = action_logprob(actor_model(learner, params), batch.obs, batch.action)
        return op.awr_actor_loss(logp, advantage, s.awr_temperature), logp

    actor, actor_opt, a_ok, a_loss, _, _ = _guarded(learner.actor_tx, pi_loss, ts.actor, ts.actor_opt)
    y = op.iql_q_target(batch.reward * s.reward_scale, batch.terminated, value_fn(learner, value, batch.next_obs),
                        s.gamma)

    def q_loss(params):
        q, stats = q_values(learner, params, ts.critic_stats, batch.obs, batch.action)
        return op.ensemble_regression(q, y), (stats, q)

    critic, critic_opt, c_ok, c_loss, (_, q), gnorm = _guarded(learner.critic_tx, q_loss, ts.critic, ts.critic_opt)
    ts = ts.replace(
        value=value, value_opt=value_opt, actor=actor, actor_opt=actor_opt, critic=critic, critic_opt=critic_opt,
        target_critic=op.polyak(ts.target_critic, critic, s.tau),
    )
    metrics = {
        "train/value_loss": v_loss_val, "train/actor_loss": a_loss, "train/critic_loss": c_loss,
        "train/q_mean": jnp.mean(q), "train/value_mean": jnp.mean(v), "train/advantage_mean": jnp.mean(advantage),
        "train/awr_weight_mean": jnp.mean(op.awr_weights(advantage, s.awr_temperature)),
        "train/critic_grad_norm": gnorm,
    }
    return ts, v_ok & a_ok & c_ok, metrics


def sample_batch(learner: Learner, ts: OffPolicyState, demos: TransitionDataset | None, key) -> TransitionBatch:
    """A batch for one gradient step, observations normalised: online transitions, and
    for rlpd the demonstrations' share appended."""
    k_online, k_demo = jax.random.split(key)
    batch = learner.buffer.sample(ts.replay, k_online)
    if learner.settings.demo_batch:
        batch = concat_batches(batch, demos.sample(k_demo, learner.settings.demo_batch))
    if learner.batch_sharding is not None:
        batch = jax.lax.with_sharding_constraint(batch, learner.batch_sharding)
    return batch.replace(obs=normalize(learner, ts.obs_stats, batch.obs),
                         next_obs=normalize(learner, ts.obs_stats, batch.next_obs))


def gradient_steps(learner: Learner, ts: OffPolicyState, demos, key, n: int):
    """``n`` gradient steps; returns the state and the metrics' sums over the steps taken
    plus ``train/updates`` and ``train/skipped_updates``."""
    step = iql_step if learner.settings.algorithm == "iql" else sac_step

    def body(ts, k):
        k_batch, k_step = jax.random.split(k)
        # Each part's update is guarded on its own (`guarded_update`): a non-finite one
        # leaves that part's parameters and optimiser state where they were.
        ts, ok, metrics = step(learner, ts, sample_batch(learner, ts, demos, k_batch), k_step)
        ts = ts.replace(grad_steps=ts.grad_steps + 1)
        metrics = jax.tree.map(lambda x: jnp.where(ok, x, 0.0), metrics)
        metrics["train/updates"] = ok.astype(jnp.float32)
        metrics["train/skipped_updates"] = 1.0 - ok.astype(jnp.float32)
        return ts, metrics

    ts, metrics = jax.lax.scan(body, ts, jax.random.split(key, n))
    return ts, jax.tree.map(jnp.sum, metrics)


# ------------------------------------------------------------------ acting and iterations


def warming_up(learner: Learner, env_steps) -> jax.Array:
    """Whether the next batched env step acts uniformly at random: until the buffer holds
    ``learning_starts`` transitions. The buffer's size is known from the env steps taken
    (and what was loaded first), so the acting side needs no word from the buffer."""
    s = learner.settings
    return s.preloaded + env_steps * s.num_envs < s.learning_starts


def choose_action(learner: Learner, actor_params, stats, obs, keys, warm):
    """The policy's sample, or a uniform random action while ``warm``; one key per env."""
    action = acting(learner, actor_params, stats)(obs, keys)
    uniform = jax.vmap(lambda k: jax.random.uniform(jax.random.fold_in(k, 1), action.shape[1:], minval=-1.0,
                                                    maxval=1.0))(keys)
    return jnp.where(warm, uniform, action)


def step_env(env: Env, state, action, warm):
    """One batched env step: ``(next env state, the transitions, the step's episode sums)``."""
    nxt = env.step(state, action)
    info = nxt.info
    transition = TransitionBatch(
        obs=state.obs,
        action=action,
        reward=nxt.reward,
        next_obs=info.get("final_obs", nxt.obs),
        terminated=nxt.done * (1.0 - nxt.truncated),
    )
    done = nxt.done
    sums = step_sums(nxt.reward, done, info.get("episode_return", jnp.zeros_like(done)),
                     info.get("episode_length", jnp.zeros_like(done)), warm)
    return nxt, transition, sums


def step_sums(reward, done, episode_return, episode_length, warm) -> dict:
    """What one batched env step adds to the iteration's env metrics."""
    return {
        "env/return_sum": jnp.sum(episode_return * done),
        "env/length_sum": jnp.sum(episode_length * done),
        "env/episodes": jnp.sum(done),
        "rollout/reward_mean": jnp.mean(reward),
        "rollout/random_actions": jnp.mean(jnp.asarray(warm, jnp.float32)),
    }


def zero_metrics(learner: Learner, ts, demos):
    """The learner's metrics of one step, all zero (a step before learning starts)."""
    shapes = jax.eval_shape(lambda t, k: gradient_steps(learner, t, demos, k, 1)[1], ts, jax.random.PRNGKey(0))
    return jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)


def learn_step(learner: Learner, ts: OffPolicyState, transition: TransitionBatch, demos, key):
    """What follows one batched env step on the learner's side: the transitions into the
    buffer, the running observation statistics moved, and ``utd_ratio`` gradient steps once
    the buffer can be learned from."""
    s = learner.settings
    obs_stats = ts.obs_stats
    if s.normalize_observations:
        obs_stats = select(finite(transition.obs), normalization.update_stats(obs_stats, transition.obs), obs_stats)
    ts = ts.replace(replay=learner.buffer.add(ts.replay, transition), obs_stats=obs_stats, env_steps=ts.env_steps + 1)
    ready = learner.buffer.size(ts.replay) >= max(s.learning_starts, s.online_batch, 1)
    zeros = zero_metrics(learner, ts, demos)
    return jax.lax.cond(ready, lambda t: gradient_steps(learner, t, demos, key, s.utd_ratio), lambda t: (t, zeros), ts)


def iteration_keys(key, rollout_length: int):
    """``(the state's next key, per-step env keys [T], per-step learner keys [T])`` from the
    state's key: the same draws in every layout."""
    key, it_key = jax.random.split(key)
    pairs = jax.vmap(jax.random.split)(step_keys(it_key, rollout_length))
    return key, pairs[:, 0], pairs[:, 1]


def online_iteration(env: Env, learner: Learner, ts: OffPolicyState, demos, env_keys_, learn_keys):
    """``rollout_length`` x (a batched env step acting with the newest parameters, then
    `learn_step`): the fused program's iteration."""
    s = learner.settings

    def body(ts, keys):
        k_env, k_learn = keys
        warm = warming_up(learner, ts.env_steps)
        state = ts.env_state
        action = choose_action(learner, ts.actor, ts.obs_stats, state.obs, env_keys(k_env, s.num_envs), warm)
        nxt, transition, sums = step_env(env, state, action, warm)
        ts, metrics = learn_step(learner, ts.replace(env_state=nxt), transition, demos, k_learn)
        return ts, {**metrics, **sums}

    ts, out = jax.lax.scan(body, ts, (env_keys_, learn_keys))
    return ts, jax.tree.map(jnp.sum, out)


def offline_iteration(learner: Learner, ts: OffPolicyState, demos, learn_keys):
    """The same number of gradient steps as an online iteration, on the buffer's data
    alone (iql before ``offline_iterations``): no env step."""
    s = learner.settings

    def body(ts, k):
        return gradient_steps(learner, ts, demos, k, s.utd_ratio)

    ts, metrics = jax.lax.scan(body, ts, learn_keys)
    metrics = jax.tree.map(jnp.sum, metrics)
    zero = jnp.zeros((), jnp.float32)
    return ts, {**metrics, "env/return_sum": zero, "env/length_sum": zero, "env/episodes": zero,
                "rollout/reward_mean": zero, "rollout/random_actions": zero}


def finish_iteration(learner: Learner, ts: OffPolicyState, sums: dict, key, rollout_actor, rollout_stats):
    """The bookkeeping every layout ends an iteration with: the key, the counters, the
    divergence count, and what the rollout acts with next (``rollout_actor``)."""
    skipped = sums["train/skipped_updates"]
    ts = ts.replace(
        key=key, step=ts.step + 1, bad_iterations=jnp.where(skipped > 0, ts.bad_iterations + 1, 0),
        rollout_actor=rollout_actor, rollout_stats=rollout_stats,
    )
    sums["rollout/replay_size"] = learner.buffer.size(ts.replay).astype(jnp.float32)
    return ts, sums


def iteration(env: Env, learner: Learner, ts: OffPolicyState, demos):
    """One iteration of the fused program; the rollout always acts with the newest
    parameters, so what it will act with next is the learner's."""
    key, env_keys_, learn_keys = iteration_keys(ts.key, learner.settings.rollout_length)
    s = learner.settings
    online = lambda t: online_iteration(env, learner, t, demos, env_keys_, learn_keys)  # noqa: E731
    if s.offline_iterations:
        ts, sums = jax.lax.cond(
            ts.step < s.offline_iterations, lambda t: offline_iteration(learner, t, demos, learn_keys), online, ts
        )
    else:
        ts, sums = online(ts)
    return finish_iteration(learner, ts, sums, key, ts.actor, ts.obs_stats)


def run_chunk(env: Env, learner: Learner, ts: OffPolicyState, demos, num_iterations):
    """``num_iterations`` iterations (a traced int: one compile for every chunk length);
    returns the state and the metrics summed over them (the replay size: the last one)."""
    # One jitted function for both uses below: the loop body reuses the trace that gave the
    # metrics' shapes (tracing the env's step is most of a start: seconds for a Brax env).
    step = jax.jit(functools.partial(iteration, env, learner))
    shapes = jax.eval_shape(step, ts, demos)[1]
    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)

    def body(i, carry):
        ts, sums = carry
        ts, metrics = step(ts, demos)
        size = metrics.pop("rollout/replay_size")
        sums = jax.tree.map(jnp.add, {k: v for k, v in sums.items() if k != "rollout/replay_size"}, metrics)
        return ts, {**sums, "rollout/replay_size": size}

    return jax.lax.fori_loop(0, num_iterations, body, (ts, zeros))


def summarize(sums: dict, num_iterations: int, rollout_length: int, substeps: int) -> dict[str, float]:
    """A chunk's summed metrics -> means per gradient step (train/*), per env step
    (rollout/*) and per episode (env/*), as host floats."""
    sums = {k: float(v) for k, v in fetch(sums).items()}
    updates = sums.pop("train/updates")
    skipped = sums.pop("train/skipped_updates")
    actor_updates = sums.pop("train/actor_updates", None)
    out = {}
    for k, v in sums.items():
        if k.startswith("train/"):
            per = actor_updates if k in ("train/actor_loss", "train/entropy", "train/alpha") and actor_updates else updates
            if per:
                out[k] = v / per
    out["train/gradient_steps"] = updates
    out["train/skipped_updates"] = skipped
    episodes = sums["env/episodes"]
    if episodes > 0:
        out["env/return"] = sums["env/return_sum"] / episodes
        out["env/episode_length"] = sums["env/length_sum"] / episodes * substeps
    out["env/episodes"] = episodes
    out["rollout/reward_mean"] = sums["rollout/reward_mean"] / max(num_iterations * rollout_length, 1)
    out["rollout/random_actions"] = sums["rollout/random_actions"]
    out["rollout/replay_size"] = sums["rollout/replay_size"]
    return out
