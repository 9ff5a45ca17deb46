"""Embodied PPO as an `Algorithm` (`flow.algorithm`): what every runner builds on.

The maths is `ppo`'s pure functions; `PPO` holds what is static (envs, model graph,
optimiser, the mesh) and offers them as the contract's parts: a state of step 0, where each
leaf lives (the env batch split over the mesh's batch axes, parameters laid out by the
partition rules), a chunk of iterations, an evaluation. `flow.fused.Fused` jits the chunk
(one program for the collocated layout), `flow.seeds.SeedBatch` vmaps it over seeds, and the
staged runner calls its steps (`act`, `learn`) stage by stage, and the host runner the same
steps between host env steps.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from rlinf_jax.algos import get_advantage, get_policy_loss
from rlinf_jax.config.schema import Config
from rlinf_jax.envs.base import reports_success
from rlinf_jax.errors import BadInput
from rlinf_jax.flow.algorithm import Algorithm, Segment
from rlinf_jax.rollout import env_keys, episode_frames, evaluate_from, evaluate_policy, step_keys
from rlinf_jax.runtime.media import image_strip
from rlinf_jax.sharding import batch_divisor, batch_sharding, param_shardings, rules_from_config
from rlinf_jax.sharding.mesh import batch_shardings, fetch, replicated
from rlinf_jax.tasks.embodied import ppo, setup as setup_lib
from rlinf_jax.tasks.embodied.setup import Setup
from rlinf_jax.tasks.embodied.state import StaleTrainState, TrainState, fresh_state


def check_batch(cfg: Config, setup: Setup, mesh, evaluates: bool = True) -> None:
    """The env batches split over the mesh's devices (the eval envs' where it evaluates) and
    the rollout into minibatches."""
    n = batch_divisor(mesh)
    env, eval_env = setup.env, setup.eval_env
    if env.num_envs % n:
        raise BadInput(
            f"env.num_envs={env.num_envs} is not divisible by the {n} devices of the mesh; "
            f"use a multiple of {n} or set cluster.num_devices"
        )
    if evaluates and eval_env.num_envs % n:
        raise BadInput(
            f"env.num_eval_envs={eval_env.num_envs} is not divisible by the {n} devices "
            f"of the mesh; use a multiple of {n}"
        )
    batch, mbs = env.num_envs * cfg.algorithm.rollout_length, cfg.algorithm.num_minibatches
    if batch % mbs:
        raise BadInput(
            f"env.num_envs * algorithm.rollout_length = {batch} is not divisible by algorithm.num_minibatches={mbs}"
        )


class PPO(Algorithm):
    """PPO (and its group-advantage kin) on ``mesh``; ``evaluates`` False for a learner that
    never runs the evaluation (a dynamic update phase's), whose eval envs need not split
    over the mesh."""

    def __init__(self, cfg: Config, setup: Setup, mesh, evaluates: bool = True):
        check_batch(cfg, setup, mesh, evaluates)
        self.cfg, self.mesh, self.setup = cfg, mesh, setup
        self._frames_fns: dict = {}
        self.env, self.eval_env, self.policy = setup.env, setup.eval_env, setup.policy
        self.graphdef, self._init_params = setup.graphdef, setup.params
        self.warm_start_metrics = setup.warm_start_metrics
        self.split_eval_envs = setup_lib.split_eval_envs(cfg)
        self.substeps = setup_lib.substeps(cfg, self.env)
        settings = ppo.PPOSettings.from_config(cfg, self.env.num_envs, self.substeps, setup_lib.group_size(cfg, self.env))
        self.env_steps_per_iteration = settings.batch_size * self.substeps
        self.has_success = reports_success(self.env)
        self.rules = rules_from_config(cfg.cluster.partition_rules)
        self.tx = setup_lib.optimizer(cfg)
        mb_sharding = None
        if settings.minibatch_size % batch_divisor(mesh) == 0:
            mb_sharding = batch_sharding(mesh, batch_dim=1)
        a = cfg.algorithm
        self.learner = ppo.Learner(
            self.policy, self.graphdef, self.tx, settings, get_advantage(a.adv_type), get_policy_loss(a.loss_type),
            mb_sharding,
        )
        # The steps: one segment per iteration, the whole rollout.
        self.rollout_length = self.learn_every = a.rollout_length
        self.optimizer_fields = ("opt_state",)
        self.stale = cfg.flow.max_staleness > 0
        self.freeze()

    # ----------------------------------------------------------------- state
    def fresh_state(self, seed: int | None = None, env_state=None) -> TrainState:
        """A run's state of step 0, unplaced: the setup's parameters for ``runner.seed``
        (the default), for another ``seed`` its warm start's (seeds side by side) or a fresh
        model's; around ``env_state`` when given (a host simulator's episode counters), else
        the env's reset."""
        seed = self.cfg.runner.seed if seed is None else seed
        if self.setup.seed_params is not None:
            params = self.setup.seed_params[seed]
        elif seed == self.cfg.runner.seed:
            params = self._init_params
        else:
            params = setup_lib.fresh_params(self.setup, seed)
        # Fresh buffers: the chunk donates its state, and init() may be called again.
        return self.state_around(jax.tree.map(jnp.copy, params), seed, env_state)

    def state_around(self, params, seed: int | None = None, env_state=None) -> TrainState:
        """The state of step 0 around ``params`` (real or abstract: the planner's)."""
        seed = self.cfg.runner.seed if seed is None else seed
        ts = fresh_state(seed, self.env, self.policy.normalizable_observations, params, self.tx, env_state)
        # A stale run's state keeps what its next rollout acts with (at step 0 the
        # parameters themselves, copied: the updates donate the learner's buffers).
        return StaleTrainState.around(ts, jax.tree.map(jnp.copy, self.acting(ts))) if self.stale else ts

    def complete(self, restored: TrainState) -> TrainState:
        """A checkpoint's state as the running state (it holds everything), unplaced."""
        return restored

    def shardings(self, ts: TrainState) -> TrainState:
        """The env batch split over the batch axes, parameters and optimiser state laid out
        by the partition rules (replicated on a pure data mesh, FSDP-split on an ``fsdp``
        axis), the rest replicated: where `place` puts each leaf of ``ts`` (real or
        abstract: the planner lays out the state it never allocates with these)."""
        rest = jax.tree.map(lambda _: replicated(self.mesh), ts.replace(env_state=None, params=None, opt_state=None))
        params, opt_state = (param_shardings(t, self.mesh, self.rules) for t in (ts.params, ts.opt_state))
        laid = rest.replace(
            params=params, opt_state=opt_state, env_state=batch_shardings(ts.env_state, self.mesh, self.env.num_envs)
        )
        # A stale state's older weights lie where the rollout reads weights laid out by this mesh.
        return laid.replace(acting=self.acting_shardings(ts.acting, self.mesh)) if isinstance(ts, StaleTrainState) else laid

    # ----------------------------------------------------------- pure programs
    def chunk(self, ts: TrainState, num_iterations):
        return ppo.run_chunk(self.env, self.learner, ts, num_iterations)

    # ------------------------------------------------------------- the steps
    def update(self, ts: TrainState, traj, last_obs, key):
        """The learner's half of an iteration on a whole trajectory ``[T, B]``."""
        return ppo.learn(self.learner, ts, traj, last_obs, key)

    def policy_fn(self, params, stats):
        return ppo.acting(self.learner, params, stats)

    def iteration_keys(self, key):
        key, rollout_key, update_key = jax.random.split(key, 3)
        return key, rollout_key, update_key

    def acting(self, ts: TrainState):
        return ts.params, ts.obs_stats

    def resume_acting(self, ts: TrainState):
        """What a stale run's next rollout acts with, as its state holds it: one iteration
        old after the first (so a stale run resumes exactly)."""
        return ts.acting, min(int(fetch(ts.step)), 1)

    def acting_shardings(self, acting, mesh):
        """The rollout lays the same weights out by its own mesh (e.g. tensor- rather than
        FSDP-split); the statistics replicated."""
        params, stats = acting
        return param_shardings(params, mesh, self.rules), jax.tree.map(lambda _: replicated(mesh), stats)

    def act(self, acting, obs, rollout_key, t, first_env, env_step):
        batch = jax.tree.leaves(obs)[0].shape[0]  # observations may be a pytree (image, tokens, ...)
        keys = env_keys(step_keys(rollout_key, self.rollout_length)[t], batch, first_env)
        action, *recorded = self.policy_fn(*acting)(obs, keys)
        return action, tuple(recorded)  # raw action, log-prob[, value]

    def learn(self, ts: TrainState, segment: Segment, update_key, k):
        raw, logprob, *value = segment.record
        traj = segment.env.replace(raw_action=raw, logprob=logprob, value=value[0] if value else None)
        return self.update(ts, traj, segment.last_obs, update_key)

    def finish(self, ts: TrainState, sums: dict, key, next_acting):
        if isinstance(ts, StaleTrainState) and next_acting is not None:
            ts = ts.replace(acting=next_acting)
        return ts.replace(key=key), sums

    def relaid(self, mesh) -> PPO:
        return PPO(self.cfg, self.setup, mesh, evaluates=False)

    def summarize(self, sums: dict, num_iterations: int) -> dict[str, float]:
        return ppo.summarize(sums, num_iterations, self.substeps, self.has_success)

    def eval_args(self, ts: TrainState) -> tuple:
        return ts.params, ts.obs_stats

    # -------------------------------------------------------------- evaluation
    def deterministic(self, params, stats):
        """``obs -> action``: the policy's evaluation action (mode or greedy decode)."""
        model = self.learner.model(params)
        return lambda obs: self.policy.act_deterministic(model, ppo.normalize(self.learner.settings, stats, obs))

    @functools.cached_property
    def image_observations(self) -> bool:
        """Whether the eval env's observations hold a camera image (what a strip can show)."""
        obs = jax.eval_shape(self.eval_env.reset, jax.random.PRNGKey(0)).obs
        return isinstance(obs, dict) and "image" in obs

    def strip(self, ts: TrainState, key, episodes: int) -> np.ndarray:
        """The first ``episodes`` deterministic eval episodes of ``ts``'s policy as one image:
        a row each, a frame per policy step (`image_strip`); image envs only."""
        steps = -(-self.cfg.env.episode_length // max(1, self.substeps))
        return image_strip(np.asarray(self.episode_frames(ts.params, ts.obs_stats, key, steps))[:, :episodes])

    def episode_frames(self, params, stats, key, num_steps: int):
        """Camera frames ``[num_steps + 1, num_eval_envs, H, W, 3]`` of the deterministic
        policy's eval episodes (envs with image observations only)."""
        # Compiled once per length: evaluations call it at every eval step (TensorBoard's strip).
        run = self._frames_fns.get(num_steps)
        if run is None:
            run = self._frames_fns[num_steps] = jax.jit(
                lambda p, s, k: episode_frames(self.eval_env, self.deterministic(p, s), k, num_steps))
        return run(params, stats, key)

    def evaluate(self, params, stats, key):
        policy = self.deterministic(params, stats)

        def place(state):
            bs, rep = batch_sharding(self.mesh), NamedSharding(self.mesh, P())
            return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, bs if x.ndim else rep), state)

        steps = self.cfg.env.episode_length
        if not self.split_eval_envs:
            ret, length, success = evaluate_policy(self.eval_env, policy, key, steps, place)
            split_success = {}
        else:
            # A benchmark with out-of-distribution splits (ManiSkill-style) reports each one.
            # The splits differ only in the episodes their reset draws (an episode id holds
            # its split), so every split's episodes run through one traced rollout, one
            # split after another: the program holds one copy of the policy and the env.
            names = list(self.split_eval_envs)
            starts = [self.split_eval_envs[s].reset(key) for s in names]
            starts = jax.tree.map(lambda *x: jnp.stack(x), *starts)
            rets, lengths, successes = jax.lax.map(
                lambda s0: evaluate_from(self.eval_env, policy, place(s0), steps), starts)
            main = names.index(self.cfg.env.name)  # the split PPO trains on is the main evaluation
            ret, length, success = rets[main], lengths[main], successes[main]
            split_success = {s: successes[i] for i, s in enumerate(names)}
        out = {
            "eval/return": jnp.mean(ret),
            "eval/return_std": jnp.std(ret),
            "eval/episode_length": jnp.mean(length) * self.substeps,
        }
        if self.has_success:
            out["eval/success"] = jnp.mean(success)
        for split, s in split_success.items():
            out[f"eval/success/{split}"] = jnp.mean(s)
        return out
