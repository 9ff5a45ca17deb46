"""The off-policy family as stages on component meshes: collocated, disaggregated or hybrid.

    env stage (env mesh)        rollout stage (rollout mesh)        learner (actor mesh, with the buffer)
    step the envs       <-- action --  act on the observations
                        --- transitions ==================================>  insert, utd_ratio gradient steps
                                       <========== actor parameters ======  (weight sync)

``flow.max_staleness=0`` (synchronous): every env step acts with the parameters of the
gradient steps just taken, as the fused program does, so every layout gives its numbers
(up to float rounding); each env step is one round trip through the three stages.

``flow.max_staleness=1`` (asynchronous, RLinf's async SAC): an iteration's env steps act
with the parameters as they were at the start of the previous iteration. The rollout of
iteration i+1 then needs nothing from the learner's iteration i, so on devices of their own
the env and rollout collect while the learner trains. Which parameters act is fixed by the
iteration count, not by timing, so an asynchronous run is as reproducible as any other;
its numbers are those of the one-iteration lag, not of the fused program.

Random keys come from the learner's state exactly as in the fused program
(`learner.iteration_keys`); the learner runs `learner.learn_step` itself.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlinf_jax.config.schema import Config
from rlinf_jax.errors import BadInput
from rlinf_jax.flow.fused import Fused
from rlinf_jax.flow.trainer import EnvTrainer
from rlinf_jax.rollout import env_keys
from rlinf_jax.sharding import Placement, batch_divisor, batch_sharding, component_mesh, shard_batch
from rlinf_jax.sharding.mesh import fetch, put, replicated
from rlinf_jax.tasks.offpolicy import learner as lib
from rlinf_jax.tasks.offpolicy.learner import OffPolicyState
from rlinf_jax.tasks.offpolicy.setup import OffPolicySetup
from rlinf_jax.tasks.offpolicy.algorithm import OffPolicy


class StagedOffPolicy(EnvTrainer):
    def __init__(self, cfg: Config, setup: OffPolicySetup, placement: Placement, devices):
        staleness = cfg.flow.max_staleness
        if staleness > 1:
            raise BadInput(
                f"flow.max_staleness={staleness}: the off-policy family's rollout runs at most one iteration behind "
                "the learner; use 0 (synchronous) or 1 (asynchronous)"
            )
        if cfg.flow.num_micro_batches != 1:
            raise BadInput("flow.num_micro_batches applies to the on-policy runner; set it to 1 for an off-policy run")
        self.cfg, self.staleness, self.placement = cfg, staleness, placement
        self.env_mesh, self.rollout_mesh, self.actor_mesh = (component_mesh(placement, c, devices)
                                                             for c in ("env", "rollout", "actor"))
        for name, mesh in (("env", self.env_mesh), ("rollout", self.rollout_mesh)):
            n = batch_divisor(mesh)
            if setup.env.num_envs % n:
                raise BadInput(f"env.num_envs={setup.env.num_envs} is not divisible by the {n} devices of the {name} mesh")
        # The learner's side is the algorithm on the actor mesh under the fused runner: its
        # state, its buffer's layout, its evaluation.
        self.algorithm = algorithm = OffPolicy(cfg, setup, self.actor_mesh)
        self.core = Fused(algorithm)
        self.env, self.eval_env, self.learner = algorithm.env, algorithm.eval_env, algorithm.learner
        self.substeps = algorithm.substeps
        self.env_steps_per_iteration = algorithm.env_steps_per_iteration
        self.grad_steps_per_iteration = algorithm.grad_steps_per_iteration
        learner, env = self.learner, self.env
        num_envs = learner.settings.num_envs

        def act(params, stats, obs, key, warm):
            return lib.choose_action(learner, params, stats, obs, env_keys(key, num_envs), warm)

        def env_step(state, action, warm, sums):
            nxt, transition, step_sums = lib.step_env(env, state, action, warm)
            return nxt, transition, jax.tree.map(jnp.add, sums, step_sums)

        def learn(ts, sums, transition, demos, key):
            ts, metrics = lib.learn_step(learner, ts, transition, demos, key)
            return ts, jax.tree.map(jnp.add, sums, metrics)

        def offline(ts, demos, learn_keys):
            return lib.offline_iteration(learner, ts, demos, learn_keys)

        self._act = jax.jit(act)
        self._env_step = jax.jit(env_step, donate_argnums=(0, 3))
        self._learn = jax.jit(learn, donate_argnums=(0, 1))
        self._offline = jax.jit(offline, donate_argnums=0)
        self._keys = jax.jit(lambda key: lib.iteration_keys(key, learner.settings.rollout_length))
        self._finish = jax.jit(lambda ts, sums, key, a, s: lib.finish_iteration(learner, ts, sums, key, a, s))
        # Traced once, not every iteration: the zeros the learner's sums start from.
        self._zero_metrics = jax.jit(lambda ts, demos: lib.zero_metrics(learner, ts, demos),
                                     out_shardings=replicated(self.actor_mesh))
        # The learner's evaluation and policy (what `evaluate` and `restore_policy` call on a
        # checkpoint's state).
        self.evaluate = self.core.evaluate
        self.policy = algorithm.policy

    # ----------------------------------------------------------------- state
    def init(self) -> OffPolicyState:
        return self.place(self.algorithm.fresh_state())

    def place(self, ts: OffPolicyState) -> OffPolicyState:
        """The learner's part on the actor mesh (the fused trainer's layout there), the env
        batch on the env mesh."""
        env_state = shard_batch(ts.env_state, self.env_mesh, self.env.num_envs)
        return self.core.place(ts.replace(env_state=None)).replace(env_state=env_state)

    def snapshot(self, ts):
        return self.core.snapshot(ts)

    def start(self, restored) -> OffPolicyState:
        if restored.replay is None:
            restored = restored.replace(replay=self.algorithm.empty_replay(restored.env_state))
        return self.place(restored)

    def progress(self, ts) -> tuple[int, int]:
        return int(ts.step), int(ts.bad_iterations)

    def compile(self, ts, eval_key) -> None:
        self.core.compile_eval(ts, eval_key)

    def run_eval(self, ts, key) -> dict:
        return self.core.run_eval(ts, key)

    def summarize(self, sums: dict, n: int) -> dict[str, float]:
        return self.core.summarize(sums, n)

    def meta(self) -> dict:
        return self.core.meta()

    # ----------------------------------------------------------------- iterations
    def _zero_env_sums(self):
        names = ("env/return_sum", "env/length_sum", "env/episodes", "rollout/reward_mean", "rollout/random_actions")
        return put({k: jnp.zeros((), jnp.float32) for k in names}, replicated(self.env_mesh))

    def run_iterations(self, ts: OffPolicyState, n: int):
        # Counters read once: within the chunk nothing waits for the devices, so the
        # asynchronous rollout of one iteration overlaps the learner's previous one.
        step, env_steps = (int(x) for x in fetch((ts.step, ts.env_steps)))
        totals = None
        for _ in range(n):
            ts, sums, env_steps = self._iteration(ts, step, env_steps)
            step += 1
            size = sums.pop("rollout/replay_size")
            totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
        return ts, {**totals, "rollout/replay_size": size}

    def _iteration(self, ts: OffPolicyState, step: int, env_steps: int):
        s = self.learner.settings
        key, env_keys_, learn_keys = self._keys(ts.key)
        env_state, learner_state = ts.env_state, ts.replace(env_state=None)
        if step < s.offline_iterations:
            learner_state, metrics = self._offline(learner_state, self.algorithm.demos, learn_keys)
            learner_state, sums = self._finish(learner_state, metrics, key, learner_state.actor, learner_state.obs_stats)
            return learner_state.replace(env_state=env_state), sums, env_steps

        rollout_keys = put(env_keys_, replicated(self.rollout_mesh))
        env_rows, rollout_rows = batch_sharding(self.env_mesh), batch_sharding(self.rollout_mesh)
        actor_rows = batch_sharding(self.actor_mesh)
        env_sums = self._zero_env_sums()
        learn_sums = self._zero_metrics(learner_state, self.algorithm.demos)

        def collect(t, acting):
            nonlocal env_state, env_sums
            warm = jnp.asarray(bool(lib.warming_up(self.learner, env_steps + t)))
            obs = put(env_state.obs, rollout_rows)
            action = put(self._act(*acting, obs, rollout_keys[t], warm), env_rows)
            env_state, transition, env_sums = self._env_step(env_state, action, warm, env_sums)
            return put(transition, actor_rows)

        if self.staleness:
            # The rollout acts with what the state holds for it; the learner's current
            # parameters (copied: the learner's steps donate theirs) act next iteration.
            acting = put((ts.rollout_actor, ts.rollout_stats), replicated(self.rollout_mesh))
            next_rollout = jax.tree.map(jnp.copy, (learner_state.actor, learner_state.obs_stats))
            transitions = [collect(t, acting) for t in range(s.rollout_length)]
            for t, transition in enumerate(transitions):
                learner_state, learn_sums = self._learn(learner_state, learn_sums, transition, self.algorithm.demos,
                                                        learn_keys[t])
        else:
            for t in range(s.rollout_length):
                acting = put((learner_state.actor, learner_state.obs_stats), replicated(self.rollout_mesh))
                transition = collect(t, acting)
                learner_state, learn_sums = self._learn(learner_state, learn_sums, transition, self.algorithm.demos,
                                                        learn_keys[t])
            next_rollout = (learner_state.actor, learner_state.obs_stats)
        sums = {**learn_sums, **put(env_sums, replicated(self.actor_mesh))}
        learner_state, sums = self._finish(learner_state, sums, key, *next_rollout)
        return learner_state.replace(env_state=env_state), sums, env_steps + s.rollout_length
