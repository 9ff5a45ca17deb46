"""Embodied PPO as stages on component meshes: collocated, disaggregated or hybrid.

    env stage (env mesh)       rollout stage (rollout mesh)       actor stage (actor mesh)
    step micro-batch m   <-- action --  infer micro-batch m
                         --- obs ---->                       == trajectories ==> learn
                                     <============ weight sync =================

The env batch is cut into ``flow.num_micro_batches`` micro-batches. When env and rollout
sit on different devices, each step is enqueued micro-batch by micro-batch, so the env
devices step micro-batch m while the rollout devices infer micro-batch m+1. When they
share devices, each micro-batch is unrolled by one fused `lax.scan` instead. Whole
trajectories go to the actor through a bounded `Channel`; with ``flow.max_staleness``
>= 1 the next rollout is enqueued with the current rollout weights *before* the actor's
update, so generation and training overlap when their devices differ.

Every number matches the fused single-jit trainer for the same seed (up to float
reduction order): random keys belong to envs (folded from the global env index) and
to iterations, never to micro-batches, and the actor runs `ppo.learn` itself.
With ``max_staleness`` >= 1 the samples are one policy version older, by design.

Across hosts the same code runs in every process; data that moves between components
on different hosts goes through `sharding.mesh.put` / `fetch` (collective there).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from rlinf_jax.config.schema import Config
from rlinf_jax.envs.base import EnvState
from rlinf_jax.errors import BadInput
from rlinf_jax.flow.channel import Channel
from rlinf_jax.flow.fused import Fused
from rlinf_jax.flow.stage import Stage
from rlinf_jax.flow.trainer import EnvTrainer
from rlinf_jax.rollout import env_keys, env_step, step_keys, unroll
from rlinf_jax.runtime.distributed import is_multiprocess
from rlinf_jax.sharding import (
    Placement,
    batch_divisor,
    batch_sharding,
    component_mesh,
    host_memory_supported,
    param_shardings,
    park,
    reshard,
    shard_batch,
    sync_weights,
    unpark,
)
from rlinf_jax.sharding.mesh import fetch, put, replicated
from rlinf_jax.tasks.embodied.setup import Setup
from rlinf_jax.tasks.embodied.state import TrainState
from rlinf_jax.tasks.embodied.algorithm import PPO

COMPONENTS = ("env", "rollout", "actor")


@dataclass
class StagedState:
    """The runner's state. ``learner`` is a TrainState without its env_state."""

    learner: TrainState
    env_states: list[EnvState]  # one per micro-batch, on the env mesh
    rollout_params: object  # on the rollout mesh; policy version ``rollout_version``
    rollout_stats: object
    rollout_version: int
    actor_version: int
    key: jax.Array  # the iteration key chain (rollout mesh); advanced once per rollout
    channel: Channel = field(repr=False)


class _Stage(Stage):
    """A stage whose inputs may sit on another host's devices (multi-host runs)."""

    def put(self, tree, batch_dim: int | None = None):
        if not is_multiprocess():
            return super().put(tree, batch_dim)
        return put(tree, replicated(self.mesh) if batch_dim is None else batch_sharding(self.mesh, batch_dim))


class StagedPPO(EnvTrainer):
    def __init__(self, cfg: Config, setup: Setup, placement: Placement, devices=None):
        devices = jax.devices() if devices is None else devices
        env = setup.env
        self.cfg, self.env, self.placement = cfg, env, placement
        self.meshes = {c: component_mesh(placement, c, devices) for c in COMPONENTS}
        # The actor half, evaluation and checkpoint layout are the fused runner's own, over
        # the algorithm laid out on the actor's mesh.
        self.algorithm = PPO(cfg, setup, self.meshes["actor"])
        self.core = Fused(self.algorithm)
        f = cfg.flow
        self.num_micro = f.num_micro_batches
        self.micro = env.num_envs // self.num_micro
        for c in ("env", "rollout"):
            n = batch_divisor(self.meshes[c])
            if self.micro % n:
                raise BadInput(
                    f"a micro-batch of {self.micro} envs (env.num_envs / flow.num_micro_batches) does not split over "
                    f"the {n} batch devices of {c}; make env.num_envs a multiple of {n * self.num_micro}"
                )
        if self.num_micro > 1 and cfg.env.reset_mode == "fresh":
            raise BadInput(
                "env.reset_mode=fresh draws resets from one key shared by the whole batch, which micro-batches "
                "cannot split; use env.reset_mode=cached or flow.num_micro_batches=1"
            )
        self.max_staleness = f.max_staleness
        self.offload = f.offload_optimizer
        if self.offload and not host_memory_supported(self.meshes["actor"].devices.flat[0]):
            raise BadInput("flow.offload_optimizer=true but these devices have no host memory kind; set it to false")
        self.T = cfg.algorithm.rollout_length
        self.env_steps_per_iteration = self.core.env_steps_per_iteration
        # cluster.scaling=dynamic: the update runs on its phase's mesh (the actor's devices
        # plus the rollout's) with a learner laid out there; the learner's state lives on
        # the actor's mesh between updates and moves there and back (`_switch`).
        self.dynamic = "update" in placement.phases
        self.update_algorithm = self.algorithm
        if self.dynamic:
            if self.max_staleness:
                raise BadInput(
                    "cluster.scaling=dynamic lends the rollout's devices to the update, and with flow.max_staleness >= 1 "
                    "the next rollout runs during the update; set flow.max_staleness=0 or cluster.scaling=static"
                )
            if self.offload:
                raise BadInput("cluster.scaling=dynamic moves the optimiser state to the update's devices each "
                               "iteration; flow.offload_optimizer parks it on the host instead: set one of them off")
            update_mesh = component_mesh(placement, "update", devices)
            n = batch_divisor(update_mesh)
            if env.num_envs % n:
                raise BadInput(
                    f"cluster.scaling=dynamic runs the update on {n} devices (the actor's and the rollout's), and "
                    f"env.num_envs={env.num_envs} does not split over them; use a multiple of {n}, or a placement "
                    "whose actor and rollout devices together divide it"
                )
            self.update_algorithm = PPO(cfg, setup, update_mesh, evaluates=False)
        self._switch_s = 0.0
        env_dev, roll_dev = (placement.components[c] for c in ("env", "rollout"))
        # Env and rollout on the same devices in the same layout: unroll each micro-batch
        # in one fused scan rather than enqueueing every step.
        self.fused_rollout = env_dev == roll_dev

        # The key chain lives with the producer: were it on the actor's devices, every
        # rollout would queue behind the update it is meant to overlap.
        self.split_key = _Stage.create("split_key", "rollout", self.meshes["rollout"], lambda k: tuple(jax.random.split(k, 3)))
        update_mesh = self.update_algorithm.mesh
        self.learn = _Stage.create("learn", "actor", update_mesh, self.update_algorithm.learn)
        self.infer = _Stage.create("infer", "rollout", self.meshes["rollout"], self._infer)
        self.step = _Stage.create("step", "env", self.meshes["env"], self._env_step, donate_argnums=0)
        self.unroll = _Stage.create("unroll", "rollout", self.meshes["rollout"], self._unroll, donate_argnums=2)
        self.stack = _Stage.create("stack", "env", self.meshes["env"], lambda xs: jax.tree.map(lambda *a: jnp.stack(a), *xs))
        self.stack_r = _Stage.create("stack_r", "rollout", self.meshes["rollout"], lambda xs: jax.tree.map(lambda *a: jnp.stack(a), *xs))
        # Trajectories are assembled where the update reads them.
        traj_sharding = batch_sharding(update_mesh, batch_dim=1)
        obs_sharding = batch_sharding(update_mesh, batch_dim=0)
        self.assemble = _Stage(
            "assemble",
            "actor",
            update_mesh,
            jax.jit(
                lambda trajs, last: (
                    jax.tree.map(lambda *a: jnp.concatenate(a, axis=1), *trajs),
                    jax.tree.map(lambda *a: jnp.concatenate(a, axis=0), *last),
                ),
                out_shardings=(traj_sharding, obs_sharding),
            ),
        )

    # ------------------------------------------------------------------ stages
    def _infer(self, params, stats, obs, rollout_key, t, first_env):
        batch = jax.tree.leaves(obs)[0].shape[0]  # observations may be a pytree (image, tokens, ...)
        keys = env_keys(step_keys(rollout_key, self.T)[t], batch, first_env)
        return self.algorithm.policy_fn(params, stats)(obs, keys)

    def _env_step(self, state, action):
        return env_step(self.env, state, action, None, None)

    def _unroll(self, params, stats, state, rollout_key, first_env):
        return unroll(self.env, self.algorithm.policy_fn(params, stats), state, rollout_key, self.T, first_env)

    # ------------------------------------------------------------- placement
    def _split_env(self, env_state: EnvState) -> list[EnvState]:
        B, mb = self.env.num_envs, self.micro
        host = fetch(env_state)
        parts = []
        for m in range(self.num_micro):
            part = jax.tree.map(lambda x: x[m * mb : (m + 1) * mb] if np.ndim(x) and x.shape[0] == B else x, host)
            parts.append(shard_batch(part, self.meshes["env"], mb))
        return parts

    def _join_env(self, parts: list[EnvState]) -> EnvState:
        host = fetch(parts)
        B = self.env.num_envs
        return jax.tree.map(
            lambda *xs: np.concatenate(xs) if np.ndim(xs[0]) and xs[0].shape[0] * len(xs) == B else xs[0], *host
        )

    # ---------------------------------------------------------- flow interface
    def init(self) -> StagedState:
        return self.start(fetch(self.core.init()))

    def start(self, ts: TrainState) -> StagedState:
        learner = self.core.place(ts.replace(env_state=None))
        if self.offload:
            learner = learner.replace(opt_state=park(learner.opt_state))
        rollout_mesh = self.meshes["rollout"]
        # The rollout lays the same weights out by its own mesh (e.g. tensor- rather than
        # FSDP-split); weight sync reshards onto exactly this layout every iteration.
        rollout_params = put(learner.params, param_shardings(learner.params, rollout_mesh, self.algorithm.rules))
        return StagedState(
            learner=learner,
            env_states=self._split_env(ts.env_state),
            rollout_params=rollout_params,
            rollout_stats=self.infer.put(learner.obs_stats),
            rollout_version=0,
            actor_version=0,
            key=self.infer.put(learner.key),
            channel=Channel("trajectories", capacity=2 if self.max_staleness else 1, max_staleness=self.max_staleness),
        )

    def snapshot(self, s: StagedState) -> TrainState:
        # The key chain may be one rollout ahead of the learner (staleness >= 1): the
        # checkpoint takes the chain's key, so a resume draws fresh, unused keys.
        return s.learner.replace(env_state=self._join_env(s.env_states), key=self.learn.put(s.key))

    def progress(self, s: StagedState) -> tuple[int, int]:
        step, bad = fetch((s.learner.step, s.learner.bad_iterations))
        return int(step), int(bad)

    def compile(self, s: StagedState, eval_key) -> None:
        # Jitted stages compile on first use; run one throwaway iteration's worth of
        # every stage on copies so that timings after this are pure execution.
        # Through the host: `start` may hand back the very arrays it is given, and the
        # probe's update frees what it moves (cluster.scaling=dynamic donates its state).
        probe = self.start(fetch(self.snapshot(s)))
        self.run_iterations(probe, 1)
        self.core.compile_eval(s.learner, eval_key)

    def run_eval(self, s: StagedState, key) -> dict:
        return self.core.run_eval(s.learner, key)

    def summarize(self, sums, n):
        return self.core.summarize(sums, n)

    @property
    def image_observations(self) -> bool:
        return self.algorithm.image_observations

    def strip(self, s: StagedState, key, episodes: int) -> np.ndarray:
        """The learner's policy on the eval env, drawn on the actor mesh, as the evaluation
        itself runs."""
        return self.algorithm.strip(s.learner, key, episodes)

    def flow_stats(self) -> dict[str, float]:
        return dict(self._flow_stats) if hasattr(self, "_flow_stats") else {}

    def update(self, learner: TrainState, traj, last_obs, key) -> tuple[TrainState, dict]:
        """One actor update from the learner's resting place and back to it: the optimiser
        state out of host memory and back (flow.offload_optimizer), or the whole state
        onto the update phase's devices and back (cluster.scaling=dynamic)."""
        if self.offload:
            learner = learner.replace(opt_state=unpark(learner.opt_state))
        if self.dynamic:
            learner = self._switch(learner, self.update_algorithm)
        learner, metrics = self.learn(learner, traj, last_obs, key)
        if self.dynamic:
            learner = self._switch(learner, self.algorithm)
        if self.offload:
            learner = learner.replace(opt_state=park(learner.opt_state))
        return learner, metrics

    def _switch(self, learner: TrainState, to: PPO) -> TrainState:
        """cluster.scaling=dynamic: the learner's state onto ``to``'s mesh (the update's, or
        back to the actor's), each source buffer freed as its copy lands; the seconds it
        took add up in ``time/switch_s``."""
        t0 = time.perf_counter()
        learner = jax.block_until_ready(reshard(learner, to.shardings(learner), donate=True))
        self._switch_s += time.perf_counter() - t0
        return learner

    @property
    def warm_start_metrics(self) -> dict | None:
        return self.algorithm.warm_start_metrics

    # -------------------------------------------------------------- execution
    def _produce(self, s: StagedState) -> None:
        """Enqueues one rollout of the whole env batch with the current rollout weights."""
        s.key, rk, update_key = self.split_key(s.key)
        mb = self.micro
        if self.fused_rollout:
            trajs = []
            for m in range(self.num_micro):
                s.env_states[m], traj = self.unroll(s.rollout_params, s.rollout_stats, s.env_states[m], rk, m * mb)
                trajs.append(traj)
        else:
            env_side = [[] for _ in range(self.num_micro)]
            roll_side = [[] for _ in range(self.num_micro)]
            for t in range(self.T):
                t_arr = np.int32(t)
                for m in range(self.num_micro):
                    obs = self.infer.put(s.env_states[m].obs, batch_dim=0)
                    action, *recorded = self.infer(s.rollout_params, s.rollout_stats, obs, rk, t_arr, np.int32(m * mb))
                    s.env_states[m], tr = self.step(s.env_states[m], self.step.put(action, batch_dim=0))
                    env_side[m].append(tr)
                    roll_side[m].append(tuple(recorded))  # raw action, log-prob[, value]
            trajs = []
            for m in range(self.num_micro):
                tr = self.stack(env_side[m])
                raw, logprob, *value = self.stack_r(roll_side[m])
                trajs.append(tr.replace(raw_action=raw, logprob=logprob, value=value[0] if value else None))
        trajs = [self.assemble.put(tr, batch_dim=1) for tr in trajs]
        last = [self.assemble.put(st.obs, batch_dim=0) for st in s.env_states]
        traj, last_obs = self.assemble(trajs, last)
        s.channel.put((traj, last_obs, self.learn.put(update_key)), s.rollout_version)

    def _sync(self, s: StagedState) -> None:
        # Also across hosts: `sync_weights` goes through `put` there.
        s.rollout_params = sync_weights(s.learner.params, s.rollout_params)
        s.rollout_stats = sync_weights(s.learner.obs_stats, s.rollout_stats)
        s.rollout_version = s.actor_version

    def run_iterations(self, s: StagedState, n: int):
        sums = None
        for _ in range(n):
            if not len(s.channel):
                self._produce(s)
            (traj, last_obs, update_key), _ = s.channel.get(s.actor_version)
            s.learner, metrics = self.update(s.learner, traj, last_obs, update_key)
            s.actor_version += 1
            if self.max_staleness:
                # Enqueue the next rollout with the weights it already has; it runs on the
                # env/rollout devices while the update above runs on the actor's.
                self._produce(s)
            self._sync(s)
            sums = metrics if sums is None else jax.tree.map(jnp.add, sums, metrics)
        st = s.channel.stats
        self._flow_stats = {"flow/staleness_mean": st.mean_staleness, "flow/staleness_max": float(st.max_staleness_seen)}
        if self.dynamic:
            self._flow_stats["time/switch_s"] = self._switch_s / n  # per iteration, both ways
            self._switch_s = 0.0
        return s, sums
