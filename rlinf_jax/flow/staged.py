"""The staged runner: any `Algorithm` as stages on component meshes, collocated,
disaggregated or hybrid.

    env stage (env mesh)       rollout stage (rollout mesh)       learner (actor mesh)
    step micro-batch m   <-- action --  act on micro-batch m
                         --- obs ---->                      == segments ==> learn
                                    <============ weight sync ==============

An iteration is the algorithm's ``rollout_length`` batched env steps. Every
``learn_every`` of them make a `Segment` that goes to the algorithm's `learn` on the
learner's devices: the whole rollout for PPO, every single step for the off-policy family.

- **Micro-batches** (``flow.num_micro_batches``): the env batch is cut into parts. When env
  and rollout sit on different devices every step is enqueued part by part, so the env
  devices step part m while the rollout devices act on part m+1. When they share devices,
  each part's steps of a segment run as one `lax.scan` instead.
- **Staleness** (``flow.max_staleness``): at 0 each segment acts with the learner's newest
  parameters, so every layout gives the fused program's numbers up to float reduction
  order (random keys belong to envs, folded from the global env index, and to iterations,
  never to parts). At 1 the rollout of iteration i acts with the parameters the learner had
  at the start of iteration i-1. It then needs nothing from the learner's iteration i-1:
  within a chunk it is enqueued right after that update, and on devices of its own it runs
  while the learner trains (JAX dispatches both without waiting). A chunk ends with nothing
  in flight, so its state is a whole checkpoint. Which parameters act is fixed by the
  iteration count, not by timing, so a stale run is as reproducible as any other, chunked
  or not, with numbers of its own.
- **Offload** (``flow.offload_optimizer``): the algorithm's optimiser state rests in host
  memory between updates.
- **Dynamic scaling** (``cluster.scaling=dynamic``): the learner's state moves onto the
  update phase's devices (the actor's plus the rollout's) for each update and back, under
  the same algorithm laid out there (`Algorithm.relaid`).

The learner's half (its state's layout, evaluation, strip) is the fused runner's over the
same algorithm on the actor's mesh. Across hosts the same code runs in every process; data
that moves between components on different hosts goes through `sharding.mesh.put`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlinf_jax.errors import BadInput
from rlinf_jax.flow.algorithm import Algorithm, Segment
from rlinf_jax.flow.fused import Fused
from rlinf_jax.flow.stage import COMPONENTS, Stage
from rlinf_jax.flow.trainer import EnvTrainer
from rlinf_jax.rollout import env_step
from rlinf_jax.runtime.distributed import is_multiprocess
from rlinf_jax.sharding import (
    Placement, batch_divisor, batch_sharding, component_mesh, host_memory_supported, park, reshard, shard_batch,
    unpark,
)
from rlinf_jax.sharding.mesh import fetch, put, replicated

@dataclass
class StagedState:
    """The runner's state between iterations."""

    learner: Any  # the algorithm's state without its env batch, on the actor's mesh
    env_states: list  # the env batch, one part per micro-batch, on the env mesh
    acting: Any  # what the next rollout acts with, on the rollout mesh
    lag: int  # learner updates the next rollout's parameters are behind the learner
    key: jax.Array  # the iteration key chain, with the producer (the rollout mesh)
    step: int  # iterations the run has taken
    env_steps: int  # batched env steps the run has taken (what `act` is told)
    pending: tuple | None = None  # a stale run's next rollout, enqueued within a chunk
    iterations: int = 0  # env iterations of the run: the staleness accounting's
    lag_sum: int = 0
    lag_max: int = 0


class _Stage(Stage):
    """A stage whose inputs may sit on another host's devices (multi-host runs)."""

    def put(self, tree, batch_dim: int | None = None):
        if not is_multiprocess():
            return super().put(tree, batch_dim)
        return put(tree, replicated(self.mesh) if batch_dim is None else batch_sharding(self.mesh, batch_dim))


class Staged(EnvTrainer):
    """``algorithm`` laid out on the actor's mesh of ``placement`` (over ``devices``)."""

    def __init__(self, algorithm: Algorithm, placement: Placement, devices):
        cfg, env = algorithm.cfg, algorithm.env
        self.algorithm, self.cfg, self.placement, self.env = algorithm, cfg, placement, env
        self.meshes = {c: component_mesh(placement, c, devices) for c in COMPONENTS}
        # The learner's half, evaluation and checkpoint layout: the fused runner's own.
        self.core = Fused(algorithm)
        f = cfg.flow
        self.staleness, self.offload = f.max_staleness, f.offload_optimizer
        if self.staleness > 1:
            raise BadInput(
                f"flow.max_staleness={self.staleness}: the rollout runs at most one iteration behind the learner; "
                "use 0 (on-policy, every layout the same numbers) or 1"
            )
        self.num_micro = f.num_micro_batches
        self.micro = env.num_envs // self.num_micro
        if env.num_envs % self.num_micro:
            raise BadInput(f"env.num_envs={env.num_envs} does not split into flow.num_micro_batches={self.num_micro}")
        for c in ("env", "rollout"):
            n = batch_divisor(self.meshes[c])
            if self.micro % n:
                raise BadInput(
                    f"a micro-batch of {self.micro} envs (env.num_envs / flow.num_micro_batches) does not split over "
                    f"the {n} batch devices of {c}; make env.num_envs a multiple of {n * self.num_micro}"
                )
        if self.num_micro > 1 and getattr(cfg.env, "reset_mode", "") == "fresh":
            raise BadInput(
                "env.reset_mode=fresh draws resets from one key shared by the whole batch, which micro-batches "
                "cannot split; use env.reset_mode=cached or flow.num_micro_batches=1"
            )
        if self.offload and not host_memory_supported(self.meshes["actor"].devices.flat[0]):
            raise BadInput("flow.offload_optimizer=true but these devices have no host memory kind; set it to false")
        self.env_steps_per_iteration = algorithm.env_steps_per_iteration
        # cluster.scaling=dynamic: the update runs on its phase's mesh with the algorithm
        # laid out there; the learner's state lives on the actor's mesh between updates.
        self.dynamic = "update" in placement.phases
        self.update_algorithm = algorithm
        if self.dynamic:
            if self.staleness:
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
            self.update_algorithm = algorithm.relaid(update_mesh)
        self._switch_s = 0.0
        # Env and rollout on the same devices in the same layout: each part's steps of a
        # segment run in one fused scan rather than one enqueued step at a time.
        self.fused_rollout = placement.components["env"] == placement.components["rollout"]
        self._zero_sums = None
        self._flow_stats: dict[str, float] = {}

        learner, rollout, env_mesh = self.update_algorithm, self.meshes["rollout"], self.meshes["env"]
        update_mesh = learner.mesh
        # The key chain lives with the producer: on the learner's devices, every rollout would
        # queue behind the update it is meant to overlap.
        self.keys = _Stage.create("keys", "rollout", rollout, algorithm.iteration_keys)
        self.act = _Stage.create("act", "rollout", rollout, algorithm.act)
        self.step = _Stage.create("step", "env", env_mesh, lambda s, a: env_step(env, s, a, None, None),
                                  donate_argnums=0)
        self.unroll = _Stage.create("unroll", "rollout", rollout, self._unroll, donate_argnums=1)
        stack = lambda xs: jax.tree.map(lambda *a: jnp.stack(a), *xs)  # noqa: E731
        self.stack = _Stage.create("stack", "env", env_mesh, stack)
        self.stack_r = _Stage.create("stack_r", "rollout", rollout, stack)

        def learn(state, sums, segment, learn_keys, k, *args):
            state, metrics = learner.learn(state, segment, learn_keys, k, *args)
            return state, jax.tree.map(jnp.add, sums, metrics)

        self.learn = _Stage.create("learn", "actor", update_mesh, learn, donate_argnums=(0, 1))
        self.offline = _Stage.create("offline", "actor", update_mesh, learner.offline_iteration, donate_argnums=0)
        self.finish = _Stage.create("finish", "actor", update_mesh, learner.finish, donate_argnums=(0, 1))
        # Segments are assembled where the learner reads them.
        self.assemble = _Stage("assemble", "actor", update_mesh, jax.jit(
            lambda env_parts, records, last: Segment(
                env=jax.tree.map(lambda *a: jnp.concatenate(a, axis=1), *env_parts),
                record=jax.tree.map(lambda *a: jnp.concatenate(a, axis=1), *records),
                last_obs=jax.tree.map(lambda *a: jnp.concatenate(a, axis=0), *last),
            ),
            out_shardings=Segment(env=batch_sharding(update_mesh, 1), record=batch_sharding(update_mesh, 1),
                                  last_obs=batch_sharding(update_mesh, 0)),
        ))

    # ------------------------------------------------------------------ stages
    def _unroll(self, acting, state, act_keys, t0, first_env, env_step0):
        """One part's steps of a segment in one scan (env and rollout on the same devices)."""
        a = self.algorithm

        def body(state, t):
            action, record = a.act(acting, state.obs, act_keys, t0 + t, first_env, env_step0 + t)
            state, tr = env_step(self.env, state, action, None, None)
            return state, (tr, record)

        return jax.lax.scan(body, state, jnp.arange(a.learn_every, dtype=jnp.int32))

    # ------------------------------------------------------------- placement
    def _split_env(self, env_state) -> list:
        B, mb = self.env.num_envs, self.micro
        host = fetch(env_state)
        parts = []
        for m in range(self.num_micro):
            part = jax.tree.map(lambda x: x[m * mb : (m + 1) * mb] if np.ndim(x) and x.shape[0] == B else x, host)
            parts.append(shard_batch(part, self.meshes["env"], mb))
        return parts

    def _join_env(self, parts: list):
        host = fetch(parts)
        B = self.env.num_envs
        return jax.tree.map(
            lambda *xs: np.concatenate(xs) if np.ndim(xs[0]) and xs[0].shape[0] * len(xs) == B else xs[0], *host
        )

    def _for_rollout(self, acting):
        """``acting`` (on the actor's mesh) laid out where the rollout reads it. A stale
        rollout keeps it past the next update, which donates the learner's buffers, so it
        gets a copy of its own (a reshard may share shards with its source)."""
        if self.staleness:
            acting = jax.tree.map(jnp.copy, acting)
        return reshard(acting, self.algorithm.acting_shardings(acting, self.meshes["rollout"]))

    def _optimizer_to(self, learner, move):
        """flow.offload_optimizer: ``learner`` with its optimiser state moved by ``move``
        (`park` to host memory, `unpark` back)."""
        if not self.offload:
            return learner
        return learner.replace(**{f: move(getattr(learner, f)) for f in self.algorithm.optimizer_fields})

    def _park(self, learner):
        return self._optimizer_to(learner, park)

    def _unpark(self, learner):
        return self._optimizer_to(learner, unpark)

    def _switch(self, learner, to: Algorithm):
        """cluster.scaling=dynamic: the learner's state onto ``to``'s mesh (the update's, or
        back to the actor's), each source buffer freed as its copy lands; the seconds it
        took add up in ``time/switch_s``."""
        t0 = time.perf_counter()
        learner = jax.block_until_ready(reshard(learner, to.shardings(learner), donate=True))
        self._switch_s += time.perf_counter() - t0
        return learner

    # ---------------------------------------------------------- flow interface
    def init(self) -> StagedState:
        return self.start(self.algorithm.fresh_state())

    def start(self, restored) -> StagedState:
        ts = self.algorithm.complete(restored)
        learner = self.core.place(ts.replace(env_state=None))
        acting, lag = self.algorithm.resume_acting(learner) if self.staleness else (self.algorithm.acting(learner), 0)
        step = int(fetch(learner.step))
        # The accounting as the run had it: a stale run's first env iteration acts with
        # the learner's own parameters and every later one a version behind, so a resumed
        # run logs the staleness an uninterrupted one does.
        done = max(step - self.algorithm.offline_iterations, 0) if lag else 0
        return StagedState(
            learner=self._park(learner),
            env_states=self._split_env(ts.env_state),
            acting=self._for_rollout(acting),
            lag=lag,
            key=self.keys.put(learner.key),
            step=step,
            env_steps=self.algorithm.env_steps_taken(learner),
            iterations=done,
            lag_sum=max(done - 1, 0),
            lag_max=min(max(done - 1, 0), 1),
        )

    def snapshot(self, s: StagedState):
        return self.algorithm.snapshot(s.learner.replace(env_state=self._join_env(s.env_states)))

    def progress(self, s: StagedState) -> tuple[int, int]:
        step, bad = fetch((s.learner.step, s.learner.bad_iterations))
        return int(step), int(bad)

    def compile(self, s: StagedState, eval_key) -> None:
        # Jitted stages compile on first use: one throwaway iteration of every stage on a
        # copy, so that timings after this are pure execution. Through the host: `start`
        # may hand back the very arrays it is given, and the probe's updates donate theirs.
        probe = self.start(fetch(self.snapshot(s)))
        self.run_iterations(probe, 1)
        self.core.compile_eval(s.learner, eval_key)

    def run_eval(self, s: StagedState, key) -> dict:
        return self.core.run_eval(s.learner, key)

    @property
    def evaluate(self):
        return self.core.evaluate

    def summarize(self, sums, n):
        return self.core.summarize(sums, n)

    def meta(self) -> dict:
        return self.core.meta()

    @property
    def image_observations(self) -> bool:
        return self.algorithm.image_observations

    def strip(self, s: StagedState, key, episodes: int) -> np.ndarray:
        """The learner's policy on the eval env, drawn on the actor mesh, as the evaluation
        itself runs."""
        return self.algorithm.strip(s.learner, key, episodes)

    @property
    def warm_start_metrics(self) -> dict | None:
        return self.algorithm.warm_start_metrics

    def flow_stats(self) -> dict[str, float]:
        return dict(self._flow_stats)

    # -------------------------------------------------------------- execution
    def _segment(self, s: StagedState, t0: int, act_keys) -> Segment:
        """Steps ``t0 .. t0 + learn_every`` of the iteration over every part of the env
        batch, acting with ``s.acting``: the segment, on the learner's mesh."""
        L, mb = self.algorithm.learn_every, self.micro
        parts = range(self.num_micro)
        if self.fused_rollout:
            env_parts, records = [None] * self.num_micro, [None] * self.num_micro
            for m in parts:
                s.env_states[m], (env_parts[m], records[m]) = self.unroll(
                    s.acting, s.env_states[m], act_keys, np.int32(t0), np.int32(m * mb), np.int32(s.env_steps + t0))
        else:
            env_side, roll_side = [[] for _ in parts], [[] for _ in parts]
            for t in range(t0, t0 + L):
                for m in parts:
                    obs = self.act.put(s.env_states[m].obs, batch_dim=0)
                    action, record = self.act(s.acting, obs, act_keys, np.int32(t), np.int32(m * mb),
                                              np.int32(s.env_steps + t))
                    s.env_states[m], tr = self.step(s.env_states[m], self.step.put(action, batch_dim=0))
                    env_side[m].append(tr)
                    roll_side[m].append(record)
            env_parts = [self.stack(x) for x in env_side]
            records = [self.stack_r(x) for x in roll_side]
        put_rows = lambda x: self.assemble.put(x, batch_dim=1)  # noqa: E731
        last = [self.assemble.put(st.obs, batch_dim=0) for st in s.env_states]
        return self.assemble([put_rows(x) for x in env_parts], [put_rows(x) for x in records], last)

    def _zeros(self, learner, segment, learn_keys):
        """The learner's metrics of an iteration before its first segment, all zero."""
        if self._zero_sums is None:
            self._zero_sums = self.update_algorithm.zero_sums(learner, segment, learn_keys)
        return self._zero_sums()

    def _update(self, learner, sums, segment, learn_keys, k: int, finish: tuple | None = None):
        """The learner's step on segment ``k`` (and with ``finish``, the iteration's
        bookkeeping after it), from the learner's resting place and back to it: the
        optimiser state out of host memory and back (flow.offload_optimizer), or the whole
        state onto the update phase's devices and back (cluster.scaling=dynamic)."""
        learner = self._unpark(learner)
        if self.dynamic:
            learner = self._switch(learner, self.update_algorithm)
        learner, sums = self.learn(learner, sums, segment, learn_keys, np.int32(k), *self.update_algorithm.chunk_args)
        if finish is not None:
            learner, sums = self.finish(learner, sums, *finish)
        if self.dynamic:
            learner = self._switch(learner, self.algorithm)
        return self._park(learner), sums

    def rollout(self, s: StagedState) -> tuple[Segment, Any]:
        """The first segment of an iteration, acting with the learner's parameters as they
        are, and its learning keys (what auto-placement times)."""
        act_keys, learn_keys, _ = self._keys(s)
        s.acting = self._for_rollout(self.algorithm.acting(s.learner))
        return self._segment(s, 0, act_keys), learn_keys

    def update(self, learner, segment: Segment, learn_keys):
        """The learner's step on the first segment of an iteration (what auto-placement
        times): ``(learner, metrics)``."""
        return self._update(learner, self._zeros(learner, segment, learn_keys), segment, learn_keys, 0)

    def _keys(self, s: StagedState):
        """The next iteration's ``(acting keys, learning keys, next key)`` off the chain,
        the last two where the learner reads them."""
        s.key, act_keys, learn_keys = self.keys(s.key)
        return act_keys, self.learn.put(learn_keys), self.learn.put(s.key)

    def _produce(self, s: StagedState) -> tuple:
        """A stale run's whole rollout of one iteration, acting with ``s.acting``: its
        segments and the keys its learning reads."""
        act_keys, learn_keys, next_key = self._keys(s)
        a = self.algorithm
        segments = [self._segment(s, t0, act_keys) for t0 in range(0, a.rollout_length, a.learn_every)]
        s.env_steps += a.rollout_length
        return segments, learn_keys, next_key

    def _iteration(self, s: StagedState, prefetch: bool) -> dict:
        a, args = self.algorithm, self.update_algorithm.chunk_args
        s.step += 1
        if s.step <= a.offline_iterations:  # learning from the data alone: no env step
            _, learn_keys, next_key = self._keys(s)
            learner, sums = self.offline(self._unpark(s.learner), learn_keys, *args)
            learner, sums = self.finish(learner, sums, next_key, None)
            s.learner = self._park(learner)
            return sums
        if not self.staleness:
            # On-policy: every segment acts with the learner's newest parameters.
            act_keys, learn_keys, next_key = self._keys(s)
            segments = a.rollout_length // a.learn_every
            sums = None
            for k in range(segments):
                s.acting = self._for_rollout(a.acting(s.learner))
                segment = self._segment(s, k * a.learn_every, act_keys)
                if sums is None:
                    sums = self._zeros(s.learner, segment, learn_keys)
                last = (next_key, None) if k == segments - 1 else None
                s.learner, sums = self._update(s.learner, sums, segment, learn_keys, k, last)
            s.env_steps += a.rollout_length
            s.iterations += 1
            return sums
        # Stale: the rollout of iteration i acts with the parameters of the start of
        # iteration i-1. `s.acting` holds what the next rollout to be produced acts with;
        # within a chunk the next iteration's rollout is enqueued right after this
        # iteration's update, so the rollout's devices never wait for the update (the
        # host blocks only on moving the newest weights over, after both are enqueued).
        # A chunk ends with nothing in flight, so its state is a whole checkpoint.
        if s.pending is None:
            s.pending = self._produce(s)
            s.acting = self._for_rollout(a.acting(s.learner))
        (segments, learn_keys, next_key), s.pending = s.pending, None
        # What the next rollout acts with, as the state records it (copied: the updates
        # donate the learner's buffers).
        next_acting = jax.tree.map(jnp.copy, a.acting(s.learner))
        sums = self._zeros(s.learner, segments[0], learn_keys)
        for k, segment in enumerate(segments):
            last = (next_key, next_acting) if k == len(segments) - 1 else None
            s.learner, sums = self._update(s.learner, sums, segment, learn_keys, k, last)
        if prefetch:
            s.pending = self._produce(s)
            s.acting = self._for_rollout(a.acting(s.learner))
        s.iterations, s.lag_sum, s.lag_max = s.iterations + 1, s.lag_sum + s.lag, max(s.lag_max, s.lag)
        s.lag = 1
        return sums

    def run_iterations(self, s: StagedState, n: int):
        totals = None
        for i in range(n):
            sums = self._iteration(s, prefetch=i < n - 1)
            totals = sums if totals is None else self.algorithm.add_sums(totals, sums)
        self._flow_stats = {"flow/staleness_mean": s.lag_sum / max(s.iterations, 1),
                            "flow/staleness_max": float(s.lag_max)}
        if self.dynamic:
            self._flow_stats["time/switch_s"] = self._switch_s / n  # per iteration, both ways
            self._switch_s = 0.0
        return s, totals
