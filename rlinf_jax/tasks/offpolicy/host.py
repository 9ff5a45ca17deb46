"""The off-policy family on a host simulator: env workers step in C, the learner in XLA.

    workers           step the batch  ---- obs, reward, done in shared memory ---->
    this process      act (jit) -> actions into shared memory ... insert + utd_ratio gradient steps (jit)

A host env cannot be stepped inside `jit`, so an iteration is a host loop of
``algorithm.rollout_length`` batched env steps, each followed by the learner's step on
the transitions it produced: the fused program's order (act with the newest parameters,
step, insert, ``utd_ratio`` gradient steps), with the same functions of `learner` and the
same keys (`learner.iteration_keys`). Env resets are seeded per global env index in the
workers (`envs.host.worker`), so the number of workers changes no number.

Checkpoints hold the learner's state, the replay buffer (unless
``algorithm.replay_in_checkpoint=false``) and each env's episode counter; a resumed run
starts every env at its next episode with that episode's seed. As for host PPO, the
simulator's state inside an unfinished episode cannot be restored, so those episodes
restart from their initial state: a resume continues the run but does not replay it bit
for bit.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from rlinf_jax.config.schema import Config
from rlinf_jax.errors import BadInput
from rlinf_jax.flow.trainer import EnvTrainer
from rlinf_jax.replay import TransitionBatch
from rlinf_jax.runtime.distributed import is_multiprocess
from rlinf_jax.rollout import env_keys
from rlinf_jax.sharding import Placement, component_mesh, fetch, from_process_rows, process_rows, put, replicate
from rlinf_jax.sharding.mesh import replicated
from rlinf_jax.tasks.env_rl.pools import HostPools, local_copy
from rlinf_jax.tasks.offpolicy import learner as lib
from rlinf_jax.tasks.offpolicy.learner import OffPolicyState
from rlinf_jax.tasks.offpolicy.setup import OffPolicySetup
from rlinf_jax.tasks.offpolicy.algorithm import OffPolicy, empty_replay, initial_state

# What the learner and the logs read of the pool after each env step.
STEP_ARRAYS = ("done", "truncated", "reward", "final_obs", "obs", "episode_return", "episode_length")
ENV_SUMS = ("env/return_sum", "env/length_sum", "env/episodes", "rollout/reward_mean", "rollout/random_actions")


@dataclass
class HostOffPolicyState:
    learner: OffPolicyState  # env_state None while running; a checkpoint's holds the episode counters
    obs: np.ndarray  # the batch's current observations [num_envs, obs]


class HostOffPolicy(HostPools, EnvTrainer):
    def __init__(self, cfg: Config, setup: OffPolicySetup, placement: Placement, devices):
        mesh = component_mesh(placement, "actor", devices)
        per_process = Counter(d.process_index for d in mesh.devices.flat)
        if not is_multiprocess() and len(mesh.devices.flat) != 1:
            raise BadInput("a host simulator (env.suite=gym) trains on one device; set cluster.num_devices=1")
        if set(per_process.values()) != {1} or len(per_process) != jax.process_count():
            raise BadInput(
                "the off-policy family on host simulators keeps a whole learner on one device of every host "
                f"(got {dict(sorted(per_process.items()))} devices per process): launch with one device per host "
                "and cluster.num_devices=all"
            )
        if cfg.flow.max_staleness or cfg.flow.num_micro_batches != 1:
            raise BadInput(
                "the off-policy family on a host simulator runs synchronously: set flow.max_staleness=0 and "
                "flow.num_micro_batches=1"
            )
        if setup.learner.settings.offline_iterations:
            raise BadInput("algorithm.offline_iterations: offline learning needs no simulator; train iql on a JAX env")
        self.cfg, self.mesh, self.setup, self.placement = cfg, mesh, setup, placement
        self.env, self.eval_env = setup.env, setup.eval_env  # `HostEnv`s: sizes and worker spec
        # The algorithm on the learner's device(s): its learner's steps are the fused
        # runner's; this runner only steps the envs on the host between them.
        self.algorithm = algorithm = OffPolicy(cfg, setup, mesh)
        self.learner = learner = algorithm.learner
        s = learner.settings
        self.substeps, self.demos = algorithm.substeps, algorithm.demos
        self.env_steps_per_iteration = algorithm.env_steps_per_iteration
        self.grad_steps_per_iteration = algorithm.grad_steps_per_iteration
        num_envs = s.num_envs
        # Across hosts each process steps the envs of its rows and every process learns the
        # same step on the whole batch (the learner replicated, one device per host): the
        # rows join on every host after each env step, so a host's actions, transitions and
        # updates are one process's, and so are the numbers.
        self.rows = process_rows(mesh, num_envs)
        self.eval_rows = process_rows(mesh, self.eval_env.num_envs)

        def act(params, stats, obs, key, warm):
            return lib.choose_action(learner, params, stats, obs, env_keys(key, num_envs), warm)

        def learn(ts, sums, transition, demos, key):
            ts, metrics = lib.learn_step(learner, ts, transition, demos, key)
            return ts, jax.tree.map(jnp.add, sums, metrics)

        self._act = jax.jit(act)
        self._learn = jax.jit(learn, donate_argnums=(0, 1))
        self._keys = jax.jit(lambda key: lib.iteration_keys(key, s.rollout_length))
        self._finish = jax.jit(lambda ts, sums, key: lib.finish_iteration(learner, ts, sums, key, ts.actor,
                                                                          ts.obs_stats))
        self._greedy = jax.jit(lambda params, stats, obs: algorithm.policy(params, stats)(obs))
        # An iteration's zero sums: traced once (untraced, finding their shapes retraces the learner every iteration).
        self._zero_metrics = jax.jit(lambda ts, demos: lib.zero_metrics(learner, ts, demos))

    # ---------------------------------------------------------- trainer protocol
    def fresh_state(self) -> OffPolicyState:
        """The state of step 0 as a checkpoint holds it (no worker started)."""
        key = jax.random.PRNGKey(self.cfg.runner.seed)
        key, _ = jax.random.split(key)  # the reset key of a JAX env's fresh state, unused here
        B = self.env.num_envs
        replay = empty_replay(self.learner, self.setup, np.zeros((B, self.env.observation_size), np.float32),
                              self.env.action_size)
        return initial_state(self.cfg, self.setup, self.learner, key, {"episode_index": np.zeros(B, np.int32)}, replay)

    # What a checkpoint restore reads into, for evaluation.
    checkpoint_target = fresh_state

    def init(self) -> HostOffPolicyState:
        return self.start(self.fresh_state())

    def start(self, restored: OffPolicyState) -> HostOffPolicyState:
        if restored.replay is None:
            obs = np.zeros((self.env.num_envs, self.env.observation_size), np.float32)
            restored = restored.replace(replay=empty_replay(self.learner, self.setup, obs, self.env.action_size))
        self._open_pool(restored.env_state["episode_index"])
        learner = replicate(restored.replace(env_state=None), self.mesh)
        return HostOffPolicyState(learner=learner, obs=self._joined({"obs": self.pool.arrays["obs"]})["obs"])

    def snapshot(self, s: HostOffPolicyState) -> OffPolicyState:
        return self.algorithm.snapshot(s.learner.replace(env_state={"episode_index": self.env_counters()}))

    def progress(self, s: HostOffPolicyState) -> tuple[int, int]:
        return int(s.learner.step), int(s.learner.bad_iterations)

    def compile(self, s: HostOffPolicyState, eval_key) -> None:
        """The acting, learning and evaluation programs compiled ahead of the first chunk."""
        ts, B = s.learner, self.env.num_envs
        rep = replicated(self.mesh)  # host data enters whole on the learner's device(s)
        f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=rep)  # noqa: E731
        key = jax.ShapeDtypeStruct(ts.key.shape, ts.key.dtype, sharding=rep)
        warm = jax.ShapeDtypeStruct((), jnp.bool_, sharding=rep)
        obs, action = f32(B, self.env.observation_size), f32(B, self.env.action_size)
        self._act = self._act.lower(ts.actor, ts.obs_stats, obs, key, warm).compile()
        transition = TransitionBatch(obs=obs, action=action, reward=f32(B), next_obs=obs, terminated=f32(B))
        sums = self._zero_metrics(ts, self.demos)
        self._learn = self._learn.lower(ts, sums, transition, self.demos, key).compile()
        if not is_multiprocess():  # across hosts each process acts on its own eval rows (`_eval_act`)
            eval_obs = f32(self.eval_env.num_envs, self.env.observation_size)
            self._greedy = self._greedy.lower(ts.actor, ts.obs_stats, eval_obs).compile()

    def meta(self) -> dict:
        return self.algorithm.meta()

    # ----------------------------------------------------------------- iterations
    def _joined(self, rows: dict) -> dict:
        """This process's rows of the env batch (host arrays) -> the whole batch, on every
        process (one gather across hosts; copies on one)."""
        if not is_multiprocess():
            return {k: np.array(v) for k, v in rows.items()}
        return fetch(from_process_rows(rows, self.mesh, self.env.num_envs))

    def _on_mesh(self, tree):
        """Host data, the same on every process, as arguments of the learner's programs
        (replicated over its devices across hosts; as they are on one process)."""
        return put(tree, replicated(self.mesh)) if is_multiprocess() else tree

    def run_iterations(self, s: HostOffPolicyState, n: int):
        totals = None
        for _ in range(n):
            sums = self._iteration(s)
            size = sums.pop("rollout/replay_size")
            totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
        return s, {**totals, "rollout/replay_size": size}

    def _iteration(self, s: HostOffPolicyState) -> dict:
        learner, pool, arr = self.learner, self.pool, self.pool.arrays
        steps = self.learner.settings.rollout_length
        key, env_keys_, learn_keys = self._keys(s.learner.key)
        ts = s.learner
        env_steps = int(ts.env_steps)
        learn_sums = self._zero_metrics(ts, self.demos)
        env_sums = dict.fromkeys(ENV_SUMS, 0.0)
        lo, hi = self.rows
        for t in range(steps):
            warm = np.bool_(lib.warming_up(learner, env_steps + t))
            action = fetch(self._act(ts.actor, ts.obs_stats, self._on_mesh(s.obs), env_keys_[t], warm))
            pool.step(action[lo:hi])
            out = self._joined({k: arr[k] for k in STEP_ARRAYS})
            done, truncated, reward = out["done"], out["truncated"], out["reward"]
            transition = TransitionBatch(obs=s.obs, action=action, reward=reward,
                                         next_obs=out["final_obs"], terminated=done * (1.0 - truncated))
            env_sums["env/return_sum"] += float(np.sum(out["episode_return"] * done))
            env_sums["env/length_sum"] += float(np.sum(out["episode_length"] * done))
            env_sums["env/episodes"] += float(np.sum(done))
            env_sums["rollout/reward_mean"] += float(np.mean(reward))
            env_sums["rollout/random_actions"] += float(warm)
            s.obs = out["obs"]
            ts, learn_sums = self._learn(ts, learn_sums, self._on_mesh(transition), self.demos, learn_keys[t])
        sums = {**learn_sums, **{k: jnp.float32(v) for k, v in env_sums.items()}}
        s.learner, sums = self._finish(ts, sums, key)
        return sums

    def summarize(self, sums: dict, n: int) -> dict[str, float]:
        return self.algorithm.summarize(sums, n)

    # -------------------------------------------------------------- evaluation
    def policy(self, actor_params, stats):
        """The deterministic policy ``obs -> action`` of the given parameters."""
        return lambda obs: self._greedy(actor_params, stats, obs)

    def _eval_act(self, actor_params, stats):
        """``pool -> actions`` of this process's eval envs: across hosts each process acts on
        its own rows with its copy of the parameters, on its device, with no collective."""
        if not is_multiprocess():
            return lambda pool: self._greedy(actor_params, stats, np.array(pool.arrays["obs"]))
        params, stats = local_copy((actor_params, stats))
        # `_greedy` stays uncompiled across hosts (`compile`): it traces for this process's rows.
        return lambda pool: self._greedy(params, stats, np.array(pool.arrays["obs"]))

    def run_eval(self, s: HostOffPolicyState, key) -> dict:
        return self.evaluate(s.learner.actor, s.learner.obs_stats, key)

    def evaluate(self, actor_params, stats, key) -> dict:
        """One deterministic episode per eval env, each from a seed drawn from ``key``."""
        episodes = self.eval_episodes(self._eval_act(actor_params, stats), key)
        return {"eval/return": float(np.mean(episodes["return"])), "eval/return_std": float(np.std(episodes["return"])),
                "eval/episode_length": float(np.mean(episodes["length"])) * self.substeps}
