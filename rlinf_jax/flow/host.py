"""The host runner: any `Algorithm` on a host simulator, whose env workers step in C while
the algorithm acts and learns in XLA.

    workers (group m)   step micro-batch m  ---- obs in shared memory ---->
    this process        act on micro-batch m+1 (jit)  ...  learn (jit) on each segment

A host env cannot be stepped inside `jit`, so an iteration is a host loop over the
algorithm's ``rollout_length`` batched env steps. For each step and each of the
``flow.num_micro_batches`` micro-batches it waits for that micro-batch's workers, asks the
algorithm's `act` for its actions, writes them into shared memory and lets the workers step
it: with two micro-batches the workers step one half while the policy acts on the other
(RLinf's ``pipeline_stage_num``). Every ``learn_every`` steps the steps taken make a
`Segment` that goes to the algorithm's `learn` on the actor's mesh, and the next steps act
with the parameters it produced: PPO learns once on the whole rollout, the off-policy
family after every env step. The iteration ends with the algorithm's `finish`.

These are the functions the fused and staged runners call, with the same keys (they
belong to envs, folded from the global env index, and to iterations), and env resets are
seeded per global env index in the workers (`envs.host.worker`), so neither the number of
micro-batches nor the number of workers changes a number.

With a camera (``env.camera``) an observation is the tabletop's structure,
``{"image", "tokens", "proprio"}``: the workers' uint8 images and state vectors from the
shared block, the task's fixed instruction tokens added here; every buffer below is that
pytree instead of one array.

Placement (``cluster.component_placement``): the envs' rows split over the rollout's mesh
and the learner runs on the actor's (its state replicated there, each segment split over
its batch axes); when the two differ, parameters move to the rollout's devices after each
learning step and the segment's rows to the actor's. In a multi-host run
(`rlinf_jax.launch`) each process opens workers for the envs whose rows its rollout devices
hold (seeded by their global indices) and acts on its own device with its copy of the
parameters; a process without rollout devices steps no env and joins the learning. The
evaluation's envs split the same way. So every layout, on one process or several, gives the
same numbers up to float summation order.

Checkpoints hold each env's episode counter (``env_state["episode_index"]``): a resumed run
starts every env at its next episode with that episode's seed. What cannot be restored is
the simulator's state inside an unfinished episode (C MuJoCo's data, the simulator's own
random state), so those episodes restart from their initial state: a resume continues the
run but does not replay it bit for bit.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlinf_jax.errors import BadInput
from rlinf_jax.flow.algorithm import Algorithm, Segment
from rlinf_jax.flow.host_pools import HostPools, local_copy
from rlinf_jax.flow.trainer import EnvTrainer
from rlinf_jax.rollout import Transition
from rlinf_jax.runtime.distributed import is_multiprocess
from rlinf_jax.sharding import (
    Placement, batch_divisor, batch_sharding, component_mesh, fetch, from_process_rows, process_rows, put, replicate,
    replicated, rows_by_process,
)

# What the workers report of each env step, beside the observations: float32 unless named.
STEP_FIELDS = ("reward", "done", "truncated", "episode_return", "episode_length", "episode_success")


@dataclass
class HostState:
    learner: Any  # the algorithm's state; env_state None while running (a checkpoint's holds the counters)
    obs: Any  # this process's envs' current observations: [envs, obs], or the camera's pytree


def _put(buf, index, value) -> None:
    """``buf[index] = value`` leaf by leaf (observation pytrees of numpy arrays)."""
    for b, v in zip(jax.tree.leaves(buf), jax.tree.leaves(value)):
        b[index] = v


def _take(tree, index):
    return jax.tree.map(lambda x: x[index], tree)


class Host(HostPools, EnvTrainer):
    """``algorithm`` (laid out on the actor's mesh) stepping the host simulator of its
    ``env`` (an `envs.host.HostEnv`) under ``placement``."""

    def __init__(self, algorithm: Algorithm, placement: Placement, devices):
        cfg = algorithm.cfg
        self.cfg, self.algorithm, self.placement = cfg, algorithm, placement
        if cfg.flow.max_staleness:
            raise BadInput(
                f"a host simulator ({cfg.env.suite}) runs synchronously: its rollout acts with the newest parameters; "
                "set flow.max_staleness=0"
            )
        if algorithm.offline_iterations:
            raise BadInput("algorithm.offpolicy.offline_iterations: offline learning needs no simulator; train it on a JAX env")
        # The learner's mesh (the actor's) and the rollout's (where the envs' rows and the acting live).
        self.mesh = mesh = algorithm.mesh
        self.rollout_mesh = component_mesh(placement, "rollout", devices)
        self.moves = self.rollout_mesh != mesh
        self.env, self.eval_env = algorithm.env, algorithm.eval_env  # `HostEnv`s: sizes and worker spec
        self.warm_start_metrics = algorithm.warm_start_metrics
        self.env_steps_per_iteration = algorithm.env_steps_per_iteration
        B = self.env.num_envs
        for name, n, where in (("env.num_envs", B, mesh), ("env.num_envs", B, self.rollout_mesh),
                               ("env.num_eval_envs", self.eval_env.num_envs, self.rollout_mesh)):
            if n % batch_divisor(where):
                which = "actor's" if where is mesh else "rollout's"
                raise BadInput(
                    f"{name}={n} is not divisible by the {batch_divisor(where)} devices of the {which} mesh; use a "
                    f"multiple or place the {which[:-2]} on fewer devices"
                )
        env_hosts = {d.process_index for d in component_mesh(placement, "env", devices).devices.flat}
        rollout_hosts = {d.process_index for d in self.rollout_mesh.devices.flat}
        if env_hosts != rollout_hosts:
            raise BadInput(
                "cluster.component_placement: a host simulator's workers hand their observations to the rollout "
                f"on the host they run on; place env and rollout on the same hosts (env on processes "
                f"{sorted(env_hosts)}, rollout on {sorted(rollout_hosts)})"
            )
        self.num_micro = cfg.flow.num_micro_batches
        # Every process's rows, so that every process refuses alike.
        by_process = rows_by_process(self.rollout_mesh, B)
        self.rows = by_process.get(jax.process_index(), (0, 0))
        self.eval_rows = process_rows(self.rollout_mesh, self.eval_env.num_envs)
        self.local_envs = local = self.rows[1] - self.rows[0]
        for n in (hi - lo for lo, hi in by_process.values()):
            if n % self.num_micro or cfg.env.num_workers > n // self.num_micro:
                where = f"a process's {n} envs (of env.num_envs={B})" if n != B else f"env.num_envs={B}"
                raise BadInput(
                    f"{where} must split into flow.num_micro_batches={self.num_micro} micro-batches of at least "
                    f"env.num_workers={cfg.env.num_workers} envs (every worker holds a slice of each)"
                )
        self.micro = local // self.num_micro
        self.T, self.L = algorithm.rollout_length, algorithm.learn_every
        self.camera = self.env.camera
        a = algorithm
        self._keys = jax.jit(a.iteration_keys)
        self._act = jax.jit(a.act)
        # The learner's state and sums stay replicated on the actor's mesh, whatever layout
        # the compiler would give an output (a buffer filled from split rows, say).
        rep = replicated(self.mesh)
        self._learn = jax.jit(self._learn_step, donate_argnums=(0, 1), out_shardings=rep)
        self._finish = jax.jit(lambda state, sums, key: a.finish(state, sums, key, None), donate_argnums=(0, 1),
                               out_shardings=rep)
        self._deterministic = jax.jit(lambda acting, obs: a.deterministic(*acting)(obs))

    # ------------------------------------------------------------- programs
    def _learn_step(self, state, sums, segment: Segment, learn_keys, k, *chunk_args):
        state, metrics = self.algorithm.learn(state, segment, learn_keys, k, *chunk_args)
        return state, jax.tree.map(jnp.add, sums, metrics)

    # --------------------------------------------------------- observations
    def _obs_spec(self):
        """One env's observation: shape and dtype per leaf."""
        if not self.camera:
            return jax.ShapeDtypeStruct((self.env.observation_size,), jnp.float32)
        shapes = self.env.observation_shapes
        return {"image": jax.ShapeDtypeStruct(shapes["image"], jnp.uint8),
                "tokens": jax.ShapeDtypeStruct(shapes["tokens"], jnp.int32),
                "proprio": jax.ShapeDtypeStruct(shapes["proprio"], jnp.float32)}

    def _obs_struct(self, *lead, sharding=None):
        return jax.tree.map(lambda sd: jax.ShapeDtypeStruct((*lead, *sd.shape), sd.dtype, sharding=sharding),
                            self._obs_spec())

    def _zeros(self, *lead):
        return jax.tree.map(lambda sd: np.zeros((*lead, *sd.shape), sd.dtype), self._obs_spec())

    def _read(self, pool, which: str, sl: slice, copy: bool = True):
        """Observations of envs ``sl`` in ``pool``'s block: ``which`` is "obs" (current) or
        "final_obs" (what a step ended on); copies, or with ``copy=False`` read-only views
        for a caller that copies them on at once (the segment's numpy buffers; a jitted call
        may read its numpy input after returning, while the workers write the block)."""
        arr = pool.arrays
        own = np.array if copy else np.asarray
        if not self.camera:
            return own(arr[which][sl])
        proprio = own(arr[which][sl])
        image = own(arr["image" if which == "obs" else "final_image"][sl])
        tokens = own(np.broadcast_to(self.env.tokens, (proprio.shape[0], *self.env.tokens.shape)))
        return {"image": image, "tokens": tokens, "proprio": proprio}

    # ---------------------------------------------------------- trainer protocol
    def fresh_state(self):
        """The state of step 0 as a checkpoint holds it (no worker started)."""
        return self.algorithm.fresh_state(env_state={"episode_index": np.zeros(self.env.num_envs, np.int32)})

    # What a checkpoint restore reads into, for evaluation.
    checkpoint_target = fresh_state

    def init(self) -> HostState:
        return self.start(self.fresh_state())

    def start(self, restored) -> HostState:
        restored = self.algorithm.complete(restored)
        self._open_pool(restored.env_state["episode_index"], self.num_micro)
        learner = replicate(restored.replace(env_state=None), self.mesh)
        obs = self._read(self.pool, "obs", slice(None)) if self.pool is not None else self._zeros(0)
        return HostState(learner=learner, obs=obs)

    def snapshot(self, s: HostState):
        return self.algorithm.snapshot(s.learner.replace(env_state={"episode_index": self.env_counters()}))

    def progress(self, s: HostState) -> tuple[int, int]:
        step, bad = fetch((s.learner.step, s.learner.bad_iterations))
        return int(step), int(bad)

    def meta(self) -> dict:
        return self.algorithm.meta()

    # ------------------------------------------------------------ placement
    @functools.cached_property
    def _rollout_here(self) -> bool:
        """Whether this process holds a device of the rollout (and so envs of both batches)."""
        return any(d.process_index == jax.process_index() for d in self.rollout_mesh.devices.flat)

    def _for_rollout(self, tree):
        """``tree`` (replicated on the actor's mesh) as this process's copy on its rollout
        device; None on a process without one. Every process calls it: moving between meshes
        may cross hosts."""
        # Free when already laid out so; it also pins the copy `local_copy` reads to a whole one.
        tree = put(tree, replicated(self.rollout_mesh))
        return local_copy(tree) if self._rollout_here else None

    def _to_actor(self, tree, batch_dim: int):
        """Every process's rows (host arrays, the rollout's cut) as one batch on the actor's mesh."""
        if not is_multiprocess():  # straight onto the actor's devices
            return jax.device_put(tree, batch_sharding(self.mesh, batch_dim))
        tree = from_process_rows(tree, self.rollout_mesh, self.env.num_envs, batch_dim)
        # Across hosts a move goes through every host (`put`): the cost of a rollout placed
        # on other hosts than the learner.
        return put(tree, batch_sharding(self.mesh, batch_dim)) if self.moves else tree

    @functools.cached_property
    def _records(self):
        """Shape and dtype of one env's part of what `act` records (a stored action, its
        log-prob, a value; the off-policy family's action and warm-up flag)."""
        state = jax.eval_shape(self.fresh_state)
        i32 = jax.ShapeDtypeStruct((), jnp.int32)
        keys = jax.eval_shape(self.algorithm.iteration_keys, state.key)[1]
        _, record = jax.eval_shape(self.algorithm.act, self.algorithm.acting(state), self._obs_struct(1), keys, i32,
                                   i32, i32)
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), record)

    def _segment_struct(self):
        """A segment on the actor's mesh, abstract: what `learn` is compiled for."""
        L, B = self.L, self.env.num_envs
        rows, last = batch_sharding(self.mesh, 1), batch_sharding(self.mesh, 0)
        f = lambda dtype=jnp.float32: jax.ShapeDtypeStruct((L, B), dtype, sharding=rows)  # noqa: E731
        env = Transition(
            obs=self._obs_struct(L, B, sharding=rows), raw_action=None, logprob=None, reward=f(), done=f(),
            truncated=f(), final_obs=self._obs_struct(L, B, sharding=rows), episode_return=f(),
            episode_length=f(jnp.int32), episode_success=f(), value=None,
        )
        record = jax.tree.map(lambda x: jax.ShapeDtypeStruct((L, B, *x.shape), x.dtype, sharding=rows), self._records)
        return Segment(env, record, self._obs_struct(B, sharding=last))

    @functools.cached_property
    def _zero_sums(self):
        """A jitted ``state -> zero metrics``, on the actor's mesh: where an iteration's sums start."""
        state = jax.eval_shape(self.fresh_state).replace(env_state=None)  # as it runs
        keys = jax.eval_shape(self.algorithm.iteration_keys, state.key)[2]
        return self.algorithm.zero_sums(state, self._segment_struct(), keys)

    def compile(self, s: HostState, eval_key) -> None:
        """The acting, learning and evaluation programs compiled ahead of the first chunk."""
        ts, a = s.learner, self.algorithm
        i32 = jax.ShapeDtypeStruct((), jnp.int32)
        keys = self._keys(ts.key)
        local = self._for_rollout((a.acting(ts), keys[1]))
        if local is not None:
            acting, act_keys = local
            if self.local_envs:
                self._act = self._act.lower(acting, self._obs_struct(self.micro), act_keys, i32, i32, i32).compile()
            if not is_multiprocess():  # across hosts each process acts on its own eval rows, traced for them
                lo, hi = self.eval_rows
                evaluating = self._for_rollout(tuple(a.eval_args(ts)))
                self._deterministic = self._deterministic.lower(evaluating, self._obs_struct(hi - lo)).compile()
        sums = self._zero_sums()
        self._learn = self._learn.lower(ts, sums, self._segment_struct(), keys[2], i32, *a.chunk_args).compile()

    # ----------------------------------------------------------------- iterations
    def run_iterations(self, s: HostState, n: int):
        totals = None
        for _ in range(n):
            sums = self._iteration(s)
            totals = sums if totals is None else self.algorithm.add_sums(totals, sums)
        return s, totals

    def _iteration(self, s: HostState) -> dict:
        a = self.algorithm
        key, act_keys, learn_keys = self._keys(s.learner.key)
        env_step = a.env_steps_taken(s.learner)  # batched env steps so far (the off-policy warm-up reads it)
        sums = self._zero_sums()
        for k in range(self.T // self.L):
            env, record = self.steps(s, act_keys, k * self.L, env_step)  # the newest parameters act
            segment = Segment(self._to_actor(env, 1), self._to_actor(record, 1), self._to_actor(s.obs, 0))
            s.learner, sums = self._learn(s.learner, sums, segment, learn_keys, np.int32(k), *a.chunk_args)
        s.learner, sums = self._finish(s.learner, sums, key)
        return sums

    def steps(self, s: HostState, act_keys, t0: int = 0, env_step: int = 0):
        """Steps ``t0 .. t0 + learn_every`` of this process's envs (a segment's), micro-batch
        by micro-batch (see the module's doc), acting with ``s``'s parameters and the
        iteration's ``act_keys``: ``(env transitions, records)`` as host arrays
        ``[learn_every, local envs, ...]``; ``s.obs`` moves on to the last step's
        observations. Every process calls it (the parameters may cross hosts)."""
        local = self._for_rollout((self.algorithm.acting(s.learner), act_keys))
        pool, L, B, mb = self.pool, self.L, self.local_envs, self.micro
        buf = {k: np.zeros((L, B), np.int32 if k == "episode_length" else np.float32) for k in STEP_FIELDS}
        buf["obs"], buf["final_obs"] = self._zeros(L, B), self._zeros(L, B)
        record = jax.tree.map(lambda x: np.zeros((L, B, *x.shape), x.dtype), self._records)
        obs = s.obs
        first = self.rows[0]  # the global index of this process's env 0 (the keys follow it)

        def collect(t, sl):  # the results of step t of micro-batch sl, once its workers answered
            arr = pool.arrays
            for k in STEP_FIELDS:
                buf[k][t, sl] = arr[k][sl]
            _put(buf["final_obs"], (t, sl), self._read(pool, "final_obs", sl, copy=False))
            _put(obs, sl, self._read(pool, "obs", sl, copy=False))

        for t in range(L if B else 0):
            acting, act_keys = local
            for m in range(self.num_micro):
                sl = pool.group(m)
                if t:
                    pool.wait(m)
                    collect(t - 1, sl)
                _put(buf["obs"], (t, sl), _take(obs, sl))
                action, rec = jax.device_get(self._act(acting, _take(obs, sl), act_keys, np.int32(t0 + t),
                                                       np.int32(first + m * mb), np.int32(env_step + t0 + t)))
                pool.arrays["action"][sl] = action.reshape(action.shape[0], -1)  # a VLA's [mb, 1, act] chunk
                pool.send(m)
                _put(record, (t, sl), rec)
        for m in range(self.num_micro if B else 0):
            sl = pool.group(m)
            pool.wait(m)
            collect(L - 1, sl)
        env = Transition(
            obs=buf["obs"], raw_action=None, logprob=None, reward=buf["reward"], done=buf["done"],
            truncated=buf["truncated"], final_obs=buf["final_obs"], episode_return=buf["episode_return"],
            episode_length=buf["episode_length"], episode_success=buf["episode_success"], value=None,
        )
        s.obs = jax.tree.map(np.copy, obs)
        return env, record

    def summarize(self, sums, n):
        return self.algorithm.summarize(sums, n)

    # -------------------------------------------------------------- evaluation
    def run_eval(self, s: HostState, key) -> dict:
        return self.evaluate(*self.algorithm.eval_args(s.learner), key)

    # An evaluation of a host simulator draws no episode strip (camera runs not yet either).
    image_observations = False

    def evaluate(self, *args) -> dict:
        """``evaluate(*algorithm.eval_args(state), key)``: one deterministic episode per eval
        env, each from a seed drawn from ``key``."""
        *eval_args, key = args
        local = self._for_rollout(tuple(eval_args))
        act = lambda pool: self._deterministic(local, self._read(pool, "obs", slice(None)))  # noqa: E731
        episodes = self.eval_episodes(act, key)
        out = {
            "eval/return": float(np.mean(episodes["return"])),
            "eval/return_std": float(np.std(episodes["return"])),
            "eval/episode_length": float(np.mean(episodes["length"])) * self.algorithm.substeps,
        }
        if self.env.has_success:
            out["eval/success"] = float(np.mean(episodes["success"]))
        return out
