"""Embodied PPO on a batched JAX env, collocated and fused.

One training iteration is: unroll the env batch for ``rollout_length`` steps with the
current policy, compute values (unless the rollout recorded them) and GAE in one batched
pass, then run ``update_epochs``
epochs of clipped PPO over shuffled minibatches. All of it is a pure function of a
`TrainState`, and `run_chunk` loops it ``n`` times inside a single `jax.jit` (the
PureJaxRL / Brax way: no host round trip between iterations). The env batch is sharded
over the mesh's ``data`` axis and parameters are replicated, so the same program runs on
1 or N devices.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct
from jax.sharding import NamedSharding, PartitionSpec as P

from rlinf_jax.algos import entropy_bonus, get_advantage, get_policy_loss, value_loss
from rlinf_jax.config.schema import Config
from rlinf_jax.envs import normalization
from rlinf_jax.envs.base import Env, EnvState
from rlinf_jax.errors import BadInput
from rlinf_jax.policies.embodied import embodied_policy
from rlinf_jax.rollout import Transition, episode_frames, evaluate_policy, unroll
from rlinf_jax.sharding import batch_divisor, batch_sharding, param_shardings, replicate, rules_from_config, shard_batch
from rlinf_jax.sharding.mesh import fetch, put


@struct.dataclass
class TrainState:
    params: Any
    opt_state: Any
    obs_stats: normalization.RunningStats
    env_state: EnvState
    key: jax.Array  # legacy uint32[2] key: a plain array, so checkpoints need no key codec
    step: jax.Array
    # Consecutive iterations in which some update was skipped for a non-finite loss/grad.
    bad_iterations: jax.Array


# Metrics summed over a chunk and reported as ratios of two sums, not as means.
# Outcome advantages over groups of episodes sharing a reset (see `_check_groups`).
GROUP_ADVANTAGES = ("grpo", "dr_grpo", "rloo")

_EPISODE_SUMS = ("env/return_sum", "env/length_sum", "env/success_sum", "env/episodes")


def _split_eval_envs(cfg: Config) -> dict[str, Env]:
    """One eval env per split of a benchmark that has them (the tabletop: train, vision,
    semantic, execution), else none."""
    if cfg.env.suite != "tabletop":
        return {}
    import dataclasses

    from rlinf_jax.envs import make_eval_env
    from rlinf_jax.envs.tabletop import SPLITS

    return {split: make_eval_env(dataclasses.replace(cfg.env, name=split)) for split in SPLITS}


def _finite(tree) -> jax.Array:
    return jnp.all(jnp.array([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def _select(pred, new, old):
    return jax.tree.map(lambda n, o: jnp.where(pred, n, o), new, old)


class PPOTrainer:
    """Holds the static parts (model graph, optimiser, env) and the jitted programs."""

    def __init__(self, cfg: Config, env: Env, eval_env: Env, mesh):
        self.cfg, self.env, self.eval_env, self.mesh = cfg, env, eval_env, mesh
        self.split_eval_envs = _split_eval_envs(cfg)
        alg = cfg.algorithm
        num_devices = batch_divisor(mesh)
        if env.num_envs % num_devices:
            raise BadInput(
                f"env.num_envs={env.num_envs} is not divisible by the {num_devices} devices of the mesh; "
                f"use a multiple of {num_devices} or set cluster.num_devices"
            )
        if eval_env.num_envs % num_devices:
            raise BadInput(
                f"env.num_eval_envs={eval_env.num_envs} is not divisible by the {num_devices} devices "
                f"of the mesh; use a multiple of {num_devices}"
            )
        self.batch_size = env.num_envs * alg.rollout_length
        if self.batch_size % alg.num_minibatches:
            raise BadInput(
                f"env.num_envs * algorithm.rollout_length = {self.batch_size} is not divisible by "
                f"algorithm.num_minibatches={alg.num_minibatches}"
            )
        self.minibatch_size = self.batch_size // alg.num_minibatches
        # Simulator steps per policy step: repeated actions, or the sub-steps of a chunk.
        self.substeps = cfg.env.action_repeat * int(getattr(env.unwrapped, "chunk_length", 1))
        self.env_steps_per_iteration = self.batch_size * self.substeps
        self.has_success = "success" in jax.eval_shape(env.reset, jax.random.PRNGKey(0)).info
        self.rules = rules_from_config(cfg.cluster.partition_rules)
        self.advantage_fn = get_advantage(alg.adv_type)
        self.group_size = self._check_groups(cfg, env)
        self.policy_loss_fn = get_policy_loss(alg.loss_type)

        self.policy = embodied_policy(cfg, env)
        if alg.normalize_observations and not self.policy.normalizable_observations:
            raise BadInput(
                f"algorithm.normalize_observations=true but actor.model.kind={cfg.actor.model.kind} takes "
                "structured observations; set algorithm.normalize_observations=false"
            )
        model = self.policy.build(nnx.Rngs(cfg.runner.seed))
        self.graphdef, self._init_params = nnx.split(model)
        self.tx = self._make_optimizer()

        self.run_chunk = jax.jit(self._run_chunk, donate_argnums=0)
        self.evaluate = jax.jit(self._evaluate)

    # ----------------------------------------------------------------- setup
    def _make_optimizer(self):
        o, alg = self.cfg.actor.optim, self.cfg.algorithm
        total_updates = self.cfg.runner.max_steps * alg.update_epochs * alg.num_minibatches
        lr = o.lr if o.lr_schedule == "constant" else optax.linear_schedule(o.lr, 0.0, total_updates)
        return optax.chain(optax.clip_by_global_norm(o.max_grad_norm), optax.adam(lr))

    def init(self) -> TrainState:
        # Fresh buffers: the chunk donates its state, and init() may be called again.
        params = jax.tree.map(jnp.copy, self._init_params)
        m = self.cfg.actor.model
        if m.kind == "vla" and m.path:
            from rlinf_jax.flow.vla_sft import load_params

            params = load_params(self.cfg, self, params)  # a supervised (sft_vla_tabletop) run
            self.warm_start_metrics = {}  # evaluated at step 0 like a warm start
            if getattr(self, "_critic_params", None) is None:
                self._critic_params = self._critic_warmup(params)
            params = jax.tree.map(jnp.copy, self._critic_params)
        elif self.cfg.sft.warm_start_steps > 0 and m.kind in ("vla", "pi0"):
            params = self._warm_start(params)
        return self.place(self.fresh_state(params))

    def fresh_state(self, params) -> TrainState:
        """The state of step 0 around ``params``: new optimiser state, reset envs, the seed's key."""
        key = jax.random.PRNGKey(self.cfg.runner.seed)
        key, reset_key = jax.random.split(key)
        env_state = jax.jit(self.env.reset)(reset_key)
        return TrainState(
            params=params,
            opt_state=self.tx.init(params),
            obs_stats=normalization.init_stats(self._stats_size()),
            env_state=env_state,
            key=key,
            step=jnp.zeros((), jnp.int32),
            bad_iterations=jnp.zeros((), jnp.int32),
        )

    def _warm_start(self, params):
        """Behaviour cloning from the scripted expert (see `flow.vla_bc`), once per run."""
        from rlinf_jax.flow import vla_bc

        if getattr(self, "_warm_params", None) is None:
            sft, seed = self.cfg.sft, self.cfg.runner.seed
            data = vla_bc.expert_demos(self.env, sft.num_demos, seed)
            fit = dict(steps=sft.warm_start_steps, lr=sft.lr, batch_size=sft.batch_size, seed=seed, log=print)
            if self.cfg.actor.model.kind == "pi0":  # flow matching on the expert's chunks
                self._warm_params, loss, error = vla_bc.flow_matching_clone(self.policy, self.graphdef, params, data, **fit)
                self.warm_start_metrics = {"warm_start/loss": float(loss[-1]), "warm_start/action_error": error}
            elif sft.dagger_rounds > 0:  # cloning, then rounds on the policy's own states
                self._warm_params, hist = vla_bc.dagger_clone(
                    self.policy, self.graphdef, params, self.env, data, rounds=sft.dagger_rounds,
                    episodes=sft.dagger_episodes, round_steps=sft.dagger_steps, **fit,
                )
                self.warm_start_metrics = {
                    "warm_start/loss": hist["loss"][-1],
                    "warm_start/bin_accuracy": hist["accuracy"][-1],
                    "warm_start/dagger_success": hist["success"][-1],
                }
            else:
                self._warm_params, loss, acc = vla_bc.behaviour_clone(self.policy, self.graphdef, params, data, **fit)
                self.warm_start_metrics = {"warm_start/loss": float(loss[-1]), "warm_start/bin_accuracy": float(acc[-1])}
            if self.cfg.actor.model.kind == "vla":
                self._warm_params = self._critic_warmup(self._warm_params)
        return jax.tree.map(jnp.copy, self._warm_params)

    def _critic_warmup(self, params):
        """The value head fitted to the warm-started policy's returns (`vla_bc.fit_value_head`),
        when ``sft.critic_warmup_steps`` > 0; the policy itself is untouched."""
        from rlinf_jax.flow import vla_bc

        sft, alg = self.cfg.sft, self.cfg.algorithm
        if sft.critic_warmup_steps <= 0 or self.group_size:  # group advantages use no critic
            return params
        params, err = vla_bc.fit_value_head(
            self.policy, self.graphdef, params, self.env, episodes=sft.critic_warmup_episodes,
            steps=sft.critic_warmup_steps, lr=sft.lr, batch_size=sft.batch_size, gamma=alg.gamma,
            reward_scale=alg.reward_scale, seed=self.cfg.runner.seed, log=print,
        )
        self.warm_start_metrics["warm_start/value_mse"] = err
        return params

    def place(self, ts: TrainState) -> TrainState:
        """Splits the env batch over the batch axes, lays parameters and optimiser state
        out by the partition rules (replicated on a pure data mesh, FSDP-split on an
        ``fsdp`` axis) and replicates the rest."""
        rest = replicate(ts.replace(env_state=None, params=None, opt_state=None), self.mesh)
        params, opt_state = (
            put(t, param_shardings(t, self.mesh, self.rules)) for t in (ts.params, ts.opt_state)
        )
        return rest.replace(
            params=params, opt_state=opt_state, env_state=shard_batch(ts.env_state, self.mesh, self.env.num_envs)
        )

    def _check_groups(self, cfg: Config, env: Env) -> int:
        """Group advantages (GRPO and kin) on an env: every env runs exactly one episode per
        iteration, and the ``env.group_size`` envs of a group share its reset, so an episode's
        return is compared with its group's. 0 when the estimator is GAE-like."""
        alg = cfg.algorithm
        if alg.adv_type not in GROUP_ADVANTAGES:
            return 0
        g = cfg.env.group_size
        if g < 2 or env.num_envs % g:
            raise BadInput(
                f"algorithm.adv_type={alg.adv_type} compares episodes within groups: set env.group_size >= 2 "
                f"dividing env.num_envs={env.num_envs} (got {g})"
            )
        if alg.rollout_length * self.substeps != cfg.env.episode_length or cfg.env.reset_mode != "fresh":
            raise BadInput(
                f"algorithm.adv_type={alg.adv_type} needs one whole episode per env per iteration: set "
                f"algorithm.rollout_length x sub-steps per step ({alg.rollout_length} x {self.substeps}) equal to "
                f"env.episode_length={cfg.env.episode_length}, and env.reset_mode=fresh"
            )
        return g

    def _stats_size(self) -> int:
        # Structured observations are never normalised; a one-element placeholder keeps
        # the state's shape the same for every policy.
        return self.env.observation_size if self.policy.normalizable_observations else 1

    def model(self, params) -> nnx.Module:
        return nnx.merge(self.graphdef, params)

    def normalize(self, stats, obs):
        if not self.cfg.algorithm.normalize_observations:
            return obs
        return normalization.normalize(stats, obs)

    # ------------------------------------------------------------- iteration
    def _iteration(self, ts: TrainState):
        key, rollout_key, update_key = jax.random.split(ts.key, 3)
        env_state, traj = unroll(
            self.env, self.policy_fn(ts.params, ts.obs_stats), ts.env_state, rollout_key, self.cfg.algorithm.rollout_length
        )
        learner, metrics = self.learn(ts.replace(env_state=None), traj, env_state.obs, update_key)
        return learner.replace(env_state=env_state, key=key), metrics

    def policy_fn(self, params, stats):
        """``(obs, per-env keys) -> (action, raw_action, logprob[, value])``: what the rollout
        runs; the value where the policy's acting pass yields it (``act_with_value``)."""
        model = self.model(params)
        act = getattr(self.policy, "act_with_value", self.policy.act)
        return lambda obs, keys: act(model, self.normalize(stats, obs), keys)

    def learn(self, ts: TrainState, traj: Transition, last_obs, update_key):
        """The actor's half of an iteration: values, advantages, PPO epochs, statistics.

        Pure in (learner state, trajectory): the fused iteration and the actor stage of the
        staged runner call this same function, which is why they agree number for number.
        ``ts.env_state`` is not read; ``ts.key`` is passed through.
        """
        alg = self.cfg.algorithm
        model = self.model(ts.params)
        advantages, returns, values = self._advantages(model, ts.obs_stats, traj, last_obs)
        params, opt_state, train_metrics = self._update(ts, traj, advantages, returns, update_key)

        # Statistics move after the update, so the update saw exactly what the policy saw.
        obs_stats = ts.obs_stats
        if alg.normalize_observations:
            updated = normalization.update_stats(obs_stats, traj.obs)
            obs_stats = _select(_finite(traj.obs), updated, obs_stats)

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
            "train/advantage_std": jnp.std(advantages),
            "rollout/reward_mean": jnp.mean(traj.reward),
            "rollout/truncation_rate": jnp.sum(traj.truncated) / jnp.maximum(jnp.sum(done), 1.0),
            "env/return_sum": jnp.sum(traj.episode_return * done),
            "env/length_sum": jnp.sum(traj.episode_length * done),
            "env/success_sum": jnp.sum(traj.episode_success * done),
            "env/episodes": jnp.sum(done),
        }
        return ts, metrics

    def _advantages(self, model, stats, traj: Transition, last_obs):
        alg = self.cfg.algorithm
        T, B = traj.reward.shape
        if self.group_size:
            # One episode per env: its return against its group's (no critic involved).
            episode_return = jnp.sum(traj.reward * alg.reward_scale, axis=0)
            adv = self.advantage_fn(episode_return, self.group_size)
            zeros = jnp.zeros((T, B), traj.reward.dtype)
            return zeros + adv[None], zeros + episode_return[None], zeros
        flat = lambda tree: jax.tree.map(lambda x: x.reshape(T * B, *x.shape[2:]), tree)  # noqa: E731
        critic = lambda o: self.policy.critic(model, self.normalize(stats, o))  # noqa: E731
        if traj.value is not None:  # recorded by the rollout's acting pass
            values, last_value = traj.value, critic(last_obs)
        else:
            v = critic(jax.tree.map(lambda a, b: jnp.concatenate([a, b]), flat(traj.obs), last_obs))
            values, last_value = v[: T * B].reshape(T, B), v[T * B :]
        truncations = final_values = None
        if alg.bootstrap_on_truncation:
            truncations = traj.truncated
            final_values = self._final_values(critic, traj).reshape(T, B)
        rewards = traj.reward * alg.reward_scale
        adv, ret = self.advantage_fn(
            rewards, values, traj.done, last_value, alg.gamma, alg.gae_lambda, truncations, final_values
        )
        return jax.lax.stop_gradient(adv), jax.lax.stop_gradient(ret), values

    def _final_values(self, critic, traj: Transition) -> jax.Array:
        """V(final observation) ``[T * B]`` where an episode was truncated (0 elsewhere).

        A time limit truncates each env at most once per ``episode_length`` sub-steps, so an
        iteration has at most ``B * ceil(T / policy steps per episode)`` truncations: the
        critic runs on those rows only, gathered, instead of on all ``T x B`` final
        observations. Should a batch ever hold more, the full pass runs instead; with none,
        no pass at all.
        """
        T, B = traj.reward.shape
        trunc = traj.truncated.reshape(T * B) > 0
        count = jnp.sum(trunc)
        steps_per_episode = max(1, -(-self.cfg.env.episode_length // self.substeps))  # ceil
        k = min(T * B, B * -(-T // steps_per_episode))
        flat_final = jax.tree.map(lambda x: x.reshape(T * B, *x.shape[2:]), traj.final_obs)
        zeros = jnp.zeros((T * B,), traj.reward.dtype)

        def gathered(o):
            (rows,) = jnp.nonzero(trunc, size=k, fill_value=0)
            v = critic(jax.tree.map(lambda x: x[rows], o))
            return zeros.at[rows].add(jnp.where(trunc[rows], v, 0.0))  # padding rows add 0

        def branch(o):
            return jax.lax.cond(count <= k, gathered, lambda o: jnp.where(trunc, critic(o), 0.0), o)

        return jax.lax.cond(count > 0, branch, lambda o: zeros, flat_final)

    def _loss(self, params, stats, batch, key):
        alg = self.cfg.algorithm
        model = self.model(params)
        obs = self.normalize(stats, batch["obs"])
        logprob, entropy, value = self.policy.evaluate_actions(model, obs, batch["raw_action"], key)
        adv = batch["advantage"]
        if alg.normalize_advantages:
            adv = (adv - jnp.mean(adv)) / (jnp.std(adv) + 1e-8)
        # Log-probs finer than a step (a VLA's per-action or per-token level, [N, k]): the
        # step's advantage applies to each of its k ratios.
        adv = jnp.broadcast_to(adv.reshape(adv.shape + (1,) * (logprob.ndim - 1)), logprob.shape)
        pg_loss, pg_metrics = self.policy_loss_fn(
            logprob, batch["logprob"], adv, clip_low=alg.clip_eps, clip_high=alg.clip_eps
        )
        v_loss = value_loss(value, None, batch["return"])
        ent = entropy_bonus(entropy)
        total = pg_loss + alg.value_coef * v_loss - alg.entropy_coef * ent
        return total, {
            "train/total_loss": total,
            "train/policy_loss": pg_loss,
            "train/value_loss": v_loss,
            "train/entropy": ent,
            "train/approx_kl": pg_metrics["approx_kl"],
            "train/clip_frac": pg_metrics["clip_fraction"],
        }

    def _update(self, ts: TrainState, traj: Transition, advantages, returns, key):
        alg = self.cfg.algorithm
        flat = {
            "obs": traj.obs,
            "raw_action": traj.raw_action,
            "logprob": traj.logprob,
            "advantage": advantages,
            "return": returns,
        }
        flat = jax.tree.map(lambda x: x.reshape(self.batch_size, *x.shape[2:]), flat)
        grad_fn = jax.value_and_grad(self._loss, has_aux=True)
        mb_sharding = None
        if self.minibatch_size % batch_divisor(self.mesh) == 0:
            mb_sharding = batch_sharding(self.mesh, batch_dim=1)

        def sgd_step(carry, minibatch):
            params, opt_state, k = carry
            k, loss_key = jax.random.split(k)
            (loss, metrics), grads = grad_fn(params, ts.obs_stats, minibatch, loss_key)
            updates, new_opt_state = self.tx.update(grads, opt_state, params)
            new_params = optax.apply_updates(params, updates)
            ok = jnp.isfinite(loss) & _finite(grads) & _finite(new_params)
            # A non-finite loss or gradient never reaches the parameters.
            params = _select(ok, new_params, params)
            opt_state = _select(ok, new_opt_state, opt_state)
            metrics = jax.tree.map(lambda x: jnp.where(ok, x, 0.0), metrics)
            metrics["train/grad_norm"] = jnp.where(ok, optax.tree.norm(grads), 0.0)
            metrics["train/ok_updates"] = ok.astype(jnp.float32)
            return (params, opt_state, k), metrics

        def epoch(carry, epoch_key):
            perm = jax.random.permutation(epoch_key, self.batch_size)
            shuffled = jax.tree.map(
                lambda x: x[perm].reshape(alg.num_minibatches, self.minibatch_size, *x.shape[1:]), flat
            )
            if mb_sharding is not None:
                shuffled = jax.lax.with_sharding_constraint(shuffled, mb_sharding)
            return jax.lax.scan(sgd_step, carry, shuffled)

        key, step_key = jax.random.split(key)
        (params, opt_state, _), metrics = jax.lax.scan(
            epoch, (ts.params, ts.opt_state, step_key), jax.random.split(key, alg.update_epochs)
        )
        ok = metrics.pop("train/ok_updates")
        n_ok = jnp.sum(ok)
        # Means over the updates that happened; skipped ones are counted, not averaged.
        means = {k: jnp.sum(v) / jnp.maximum(n_ok, 1.0) for k, v in metrics.items()}
        means["train/skipped_updates"] = ok.size - n_ok
        return params, opt_state, means

    # ----------------------------------------------------------------- chunks
    def _run_chunk(self, ts: TrainState, num_iterations):
        """Runs ``num_iterations`` (a traced int: one compile for every chunk length)."""
        shapes = jax.eval_shape(self._iteration, ts)[1]
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

        def body(i, carry):
            ts, sums = carry
            ts, metrics = self._iteration(ts)
            return ts, jax.tree.map(jnp.add, sums, metrics)

        return jax.lax.fori_loop(0, num_iterations, body, (ts, zeros))

    def summarize(self, sums: dict, num_iterations: int) -> dict[str, float]:
        """Turns a chunk's summed metrics into per-iteration means and episode averages."""
        sums = {k: float(v) for k, v in fetch(sums).items()}
        out = {k: v / num_iterations for k, v in sums.items() if k not in _EPISODE_SUMS}
        out["train/skipped_updates"] = sums["train/skipped_updates"]
        episodes = sums["env/episodes"]
        if episodes > 0:
            out["env/return"] = sums["env/return_sum"] / episodes
            out["env/episode_length"] = sums["env/length_sum"] / episodes * self.substeps
            if self.has_success:
                out["env/success"] = sums["env/success_sum"] / episodes
        out["env/episodes"] = episodes
        return out

    # ---------------------------------------------------------- flow interface
    # What the host loop (embodied_runner) calls; `StagedPPO` implements the same.
    def start(self, ts: TrainState) -> TrainState:
        """A (restored) checkpoint state -> the runner's state, placed on devices."""
        return self.place(ts)

    def snapshot(self, ts: TrainState) -> TrainState:
        """The runner's state -> what a checkpoint holds."""
        return ts

    def progress(self, ts: TrainState) -> tuple[int, int]:
        return int(ts.step), int(ts.bad_iterations)

    def compile(self, ts: TrainState, eval_key) -> None:
        """Compiles ahead of time so the first chunk's timing is pure execution."""
        self._chunk = self.run_chunk.lower(ts, jnp.int32(1)).compile()
        self._eval = self.evaluate.lower(ts.params, ts.obs_stats, eval_key).compile()

    def run_iterations(self, ts: TrainState, n: int):
        return self._chunk(ts, jnp.int32(n))

    def run_eval(self, ts: TrainState, key) -> dict:
        return self._eval(ts.params, ts.obs_stats, key)

    def flow_stats(self) -> dict[str, float]:
        return {}

    # -------------------------------------------------------------- evaluation
    def episode_frames(self, params, stats, key, num_steps: int):
        """Camera frames ``[num_steps + 1, num_eval_envs, H, W, 3]`` of the deterministic
        policy's eval episodes (envs with image observations only)."""
        model = self.model(params)

        def policy(obs):
            return self.policy.act_deterministic(model, self.normalize(stats, obs))

        run = jax.jit(lambda p, k: episode_frames(self.eval_env, policy, k, num_steps))
        return run(params, key)

    def _evaluate(self, params, stats, key):
        model = self.model(params)

        def policy(obs):
            return self.policy.act_deterministic(model, self.normalize(stats, obs))

        def place(state):
            bs, rep = batch_sharding(self.mesh), NamedSharding(self.mesh, P())
            return jax.tree.map(
                lambda x: jax.lax.with_sharding_constraint(x, bs if x.ndim else rep), state
            )

        ret, length, success = evaluate_policy(self.eval_env, policy, key, self.cfg.env.episode_length, place)
        out = {
            "eval/return": jnp.mean(ret),
            "eval/return_std": jnp.std(ret),
            "eval/episode_length": jnp.mean(length) * self.substeps,
        }
        if self.has_success:
            out["eval/success"] = jnp.mean(success)
        # Benchmarks with out-of-distribution splits report each one (ManiSkill-style).
        for split, env in self.split_eval_envs.items():
            if split == self.cfg.env.name:
                split_success = success  # the main eval env already ran this split
            else:
                _, _, split_success = evaluate_policy(env, policy, key, self.cfg.env.episode_length, place)
            out[f"eval/success/{split}"] = jnp.mean(split_success)
        return out
