"""The off-policy family (SAC, CrossQ, RLPD, IQL) as an `Algorithm` (`flow.algorithm`).

The maths is `learner`'s pure functions; `OffPolicy` holds what is static (envs, networks'
graphs, optimisers, the mesh) and offers the contract's parts: a state of step 0 with its
replay buffer, where each leaf lives (the env batch and the buffer's rows split over the
mesh's batch axes, so each device steps its envs and keeps their transitions; parameters
replicated), a chunk of iterations (env steps, inserts and gradient steps), an evaluation.
`flow.fused.Fused` jits the chunk, `flow.seeds.SeedBatch` vmaps it over seeds,
`flow.staged.Staged` and `flow.host.Host` call its steps (`act`, then `learn` after every
env step)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from rlinf_jax.config.schema import Config
from rlinf_jax.envs import normalization
from rlinf_jax.errors import BadInput
from rlinf_jax.flow.algorithm import Algorithm, Segment
from rlinf_jax.replay import TransitionBatch, TransitionDataset
from rlinf_jax.rollout import env_keys, evaluate_policy
from rlinf_jax.sharding import batch_divisor, batch_sharding, replicate
from rlinf_jax.sharding.mesh import batch_shardings, fetch, replicated
from rlinf_jax.tasks.offpolicy import learner as lib
from rlinf_jax.tasks.offpolicy.learner import OffPolicyState
from rlinf_jax.tasks.offpolicy.setup import OffPolicySetup, seeded


def preload(buffer, replay, dataset: TransitionBatch, num_envs: int):
    """``replay`` with the dataset appended, ``num_envs`` transitions per add (a remainder
    of fewer than ``num_envs`` transitions is left out)."""
    rows = dataset.size // num_envs
    chunks = jax.tree.map(lambda x: jnp.asarray(x[: rows * num_envs]).reshape(rows, num_envs, *x.shape[1:]), dataset)
    return jax.lax.scan(lambda r, step: (buffer.add(r, step), None), replay, chunks)[0]


def initial_state(cfg: Config, setup: OffPolicySetup, learner: lib.Learner, key, env_state, replay) -> OffPolicyState:
    """The state of step 0: the setup's networks (copied: the programs donate their
    state), fresh optimisers and counters, around the given env state and buffer."""
    copy = lambda tree: jax.tree.map(jnp.copy, tree)  # noqa: E731
    log_alpha = jnp.log(jnp.asarray(cfg.algorithm.offpolicy.init_alpha, jnp.float32))
    critic = copy(setup.critic)
    obs_size = setup.env.observation_size
    return OffPolicyState(
        actor=copy(setup.actor),
        critic=critic,
        critic_stats=copy(setup.critic_stats),
        target_critic=copy(setup.critic) if learner.settings.has_target else nnx.State({}),
        value=copy(setup.value),
        log_alpha=log_alpha,
        actor_opt=learner.actor_tx.init(setup.actor),
        critic_opt=learner.critic_tx.init(critic),
        alpha_opt=learner.alpha_tx.init(log_alpha),
        value_opt=learner.value_tx.init(setup.value) if learner.value_tx is not None else nnx.State({}),
        obs_stats=normalization.init_stats(obs_size),
        env_state=env_state,
        replay=replay,
        key=key,
        step=jnp.zeros((), jnp.int32),
        env_steps=jnp.zeros((), jnp.int32),
        grad_steps=jnp.zeros((), jnp.int32),
        bad_iterations=jnp.zeros((), jnp.int32),
        rollout_actor=copy(setup.actor),
        rollout_stats=normalization.init_stats(obs_size),
    )


def empty_replay(learner: lib.Learner, setup: OffPolicySetup, obs, action_size: int):
    """A new buffer for batches shaped like ``obs`` [num_envs, obs] (for iql holding the
    dataset, which it learns from first)."""
    num_envs = learner.settings.num_envs
    reward = jnp.zeros((num_envs,), jnp.float32)
    example = TransitionBatch(obs=jnp.asarray(obs), action=jnp.zeros((num_envs, action_size), jnp.float32),
                              reward=reward, next_obs=jnp.asarray(obs), terminated=reward)
    replay = jax.jit(learner.buffer.init)(example)
    if learner.settings.algorithm == "iql":
        replay = jax.jit(lambda r: preload(learner.buffer, r, setup.dataset, num_envs))(replay)
    return replay


class OffPolicy(Algorithm):
    """The algorithm ``cfg.algorithm.name`` names, its state laid out on ``mesh``."""

    def __init__(self, cfg: Config, setup: OffPolicySetup, mesh):
        n = batch_divisor(mesh)
        for name, env in (("env.num_envs", setup.env), ("env.num_eval_envs", setup.eval_env)):
            if env.num_envs % n:
                raise BadInput(f"{name}={env.num_envs} is not divisible by the {n} devices of the mesh; use a multiple of {n}")
        self.cfg, self.mesh, self.setup = cfg, mesh, setup
        self.env, self.eval_env = setup.env, setup.eval_env
        self.learner = dataclasses.replace(setup.learner, batch_sharding=replicated(mesh))
        s = self.learner.settings
        self.substeps = cfg.env.action_repeat
        self.env_steps_per_iteration = s.num_envs * s.rollout_length * self.substeps
        self.grad_steps_per_iteration = s.rollout_length * s.utd_ratio
        # RLPD's demonstrations: a fixed argument of every chunk, replicated.
        self.demos = None
        if s.demo_batch:
            self.demos = replicate(TransitionDataset.from_arrays(setup.dataset), mesh)
        self.chunk_args = (self.demos,)
        # The steps: a learner step after every batched env step.
        self.rollout_length, self.learn_every = s.rollout_length, 1
        self.offline_iterations = s.offline_iterations
        self.optimizer_fields = ("actor_opt", "critic_opt", "alpha_opt", "value_opt")
        self.freeze()

    # ----------------------------------------------------------------- state
    def fresh_state(self, seed: int | None = None, env_state=None) -> OffPolicyState:
        """A run's state of step 0, unplaced (``seed`` defaults to ``runner.seed``), around
        ``env_state`` when given (a host simulator's episode counters), else the env's reset."""
        seed = self.cfg.runner.seed if seed is None else seed
        key = jax.random.PRNGKey(seed)
        key, reset_key = jax.random.split(key)
        env_state = jax.jit(self.env.reset)(reset_key) if env_state is None else env_state
        setup = seeded(self.cfg, self.setup, seed)
        return initial_state(self.cfg, setup, self.learner, key, env_state, self.empty_replay())

    def empty_replay(self):
        """A new buffer (for iql holding the dataset, which it learns from first)."""
        obs = np.zeros((self.env.num_envs, self.env.observation_size), np.float32)  # its shape, not its values
        return empty_replay(self.learner, self.setup, obs, self.env.action_size)

    def shardings(self, ts: OffPolicyState) -> OffPolicyState:
        """The env batch and the buffer's rows split over the batch axes; the rest replicated
        (of real or abstract state: how the planner lays out a state it never allocates)."""
        rep, n = replicated(self.mesh), self.env.num_envs
        rest = jax.tree.map(lambda _: rep, ts.replace(env_state=None, replay=None))
        replay = ts.replay.replace(experience=batch_shardings(ts.replay.experience, self.mesh, n),
                                   current_index=rep, is_full=rep)
        return rest.replace(env_state=batch_shardings(ts.env_state, self.mesh, n), replay=replay)

    # ----------------------------------------------------------- pure programs
    def chunk(self, ts: OffPolicyState, demos, num_iterations):
        return lib.run_chunk(self.env, self.learner, ts, demos, num_iterations)

    # ------------------------------------------------------------- the steps
    def iteration_keys(self, key):
        return lib.iteration_keys(key, self.rollout_length)

    def acting(self, ts: OffPolicyState):
        return ts.actor, ts.obs_stats

    def resume_acting(self, ts: OffPolicyState):
        """The parameters the state says the rollout acts with next: one iteration old in a
        stale run (the checkpoint holds them, so such a run resumes exactly)."""
        return (ts.rollout_actor, ts.rollout_stats), min(int(fetch(ts.step)), 1)

    def act(self, acting, obs, env_keys_, t, first_env, env_step):
        n = obs.shape[0]
        warm = lib.warming_up(self.learner, env_step)
        action = lib.choose_action(self.learner, *acting, obs, env_keys(env_keys_[t], n, first_env), warm)
        return action, (action, jnp.broadcast_to(warm, (n,)))

    def learn(self, ts: OffPolicyState, segment: Segment, learn_keys, k, demos):
        step = jax.tree.map(lambda x: x[0], segment.env)  # one env step per segment
        action, warm = (x[0] for x in segment.record)
        transition = TransitionBatch(obs=step.obs, action=action, reward=step.reward, next_obs=step.final_obs,
                                     terminated=step.done * (1.0 - step.truncated))
        ts, metrics = lib.learn_step(self.learner, ts, transition, demos, learn_keys[k])
        sums = lib.step_sums(step.reward, step.done, step.episode_return, step.episode_length, warm)
        return ts, {**metrics, **sums}

    def finish(self, ts: OffPolicyState, sums: dict, key, next_acting):
        return lib.finish_iteration(self.learner, ts, sums, key, *(self.acting(ts) if next_acting is None else next_acting))

    def offline_iteration(self, ts: OffPolicyState, learn_keys, demos):
        return lib.offline_iteration(self.learner, ts, demos, learn_keys)

    def env_steps_taken(self, ts: OffPolicyState) -> int:
        return int(fetch(ts.env_steps))

    def add_sums(self, totals: dict, sums: dict) -> dict:
        # The buffer's size is a level: the chunk reports the last iteration's.
        return {**super().add_sums(totals, sums), "rollout/replay_size": sums["rollout/replay_size"]}

    # ---------------------------------------------------------- host side
    def snapshot(self, ts: OffPolicyState):
        # Without the buffer (algorithm.offpolicy.replay_in_checkpoint=false) a resume refills it.
        return ts if self.cfg.algorithm.offpolicy.replay_in_checkpoint else ts.replace(replay=None)

    def complete(self, restored) -> OffPolicyState:
        """A checkpoint's state as the running state, unplaced: without the buffer
        (``algorithm.offpolicy.replay_in_checkpoint=false``) an empty one."""
        if restored.replay is None:
            restored = restored.replace(replay=self.empty_replay())
        return restored

    def eval_args(self, ts: OffPolicyState) -> tuple:
        return ts.actor, ts.obs_stats

    def summarize(self, sums: dict, n: int) -> dict[str, float]:
        return lib.summarize(sums, n, self.learner.settings.rollout_length, self.substeps)

    def meta(self) -> dict:
        info = {"algorithm": self.learner.settings.algorithm}
        if self.setup.dataset_meta is not None:
            info["dataset"] = {"path": self.cfg.algorithm.offpolicy.demo_path, **self.setup.dataset_meta}
        return info

    # -------------------------------------------------------------- evaluation
    def deterministic(self, actor_params, stats):
        """The deterministic policy ``obs -> action`` of the given parameters."""
        return lib.greedy(self.learner, actor_params, stats)

    def evaluate(self, actor_params, stats, key):
        policy = self.deterministic(actor_params, stats)

        def place(state):
            bs, rep = batch_sharding(self.mesh), NamedSharding(self.mesh, P())
            return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, bs if np.ndim(x) else rep), state)

        ret, length, _ = evaluate_policy(self.eval_env, policy, key, self.cfg.env.episode_length, place)
        return {
            "eval/return": jnp.mean(ret),
            "eval/return_std": jnp.std(ret),
            "eval/episode_length": jnp.mean(length) * self.substeps,
        }
