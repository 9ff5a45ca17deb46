"""Embodied PPO on a host simulator: env workers step in C while the policy infers in XLA.

    workers (group m)   step micro-batch m  ---- obs in shared memory ---->
    this process        infer micro-batch m+1 (jit)  ...  ppo.learn (jit) on the whole rollout

A host env cannot be stepped inside `jit`, so the rollout is a host loop: for each step
and each of the ``flow.num_micro_batches`` micro-batches, wait for that micro-batch's
workers, infer its actions, write them into shared memory and let the workers step it.
With two micro-batches the workers step one half while the policy infers the other
(RLinf's ``pipeline_stage_num``); every worker holds envs of both halves, so each half
is stepped by all of them. With one micro-batch they take turns.

The maths is the `PPO` algorithm's, as the fused runner runs it: its learner, update and
acting functions, and the policy's
keys folded from each env's global index and the step exactly as in `rollout.unroll`,
with env resets seeded per global env index in the workers, so the number of
micro-batches or workers changes no number.

With a camera (``env.camera``) an observation is the tabletop's structure,
``{"image", "tokens", "proprio"}``: the workers' uint8 images and state vectors from the
shared block, the task's fixed instruction tokens added here; every buffer below is that
pytree instead of one array.

Placement (``cluster.component_placement``): the envs' rows split over the rollout's
mesh and the update runs on the actor's, data-parallel over its batch axes; when the two
differ, parameters move to the rollout's devices before each rollout and the rollout's
rows to the actor's after it. In a multi-host run (`rlinf_jax.launch`) each process opens
workers for the envs whose rows its rollout devices hold (seeded by their global
indices) and infers on its own device with its copy of the parameters; a process without
rollout devices steps no env and joins the update. The evaluation's envs split the same
way. So every layout, on one process or several, gives the same numbers up to float
summation order.

Checkpoints hold each env's episode counter (``env_state["episode_index"]``): a resumed
run starts every env at its next episode with that episode's seed. What cannot be
restored is the simulator's state inside an unfinished episode (C MuJoCo's data, the
simulator's own random state), so those episodes restart from their initial state.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from rlinf_jax.algos import GROUP_OUTCOME_ADVANTAGES
from rlinf_jax.config.schema import Config
from rlinf_jax.envs import normalization
from rlinf_jax.envs.host import HostEnvPool
from rlinf_jax.errors import BadInput
from rlinf_jax.flow.trainer import EnvTrainer
from rlinf_jax.rollout import Transition, env_keys, step_keys
from rlinf_jax.runtime.distributed import is_multiprocess
from rlinf_jax.sharding import (
    Placement, batch_divisor, batch_sharding, component_mesh, fetch, from_process_rows, process_rows, put, replicate,
    replicated, rows_by_process,
)
from rlinf_jax.tasks.embodied.algorithm import PPO, check_batch
from rlinf_jax.tasks.embodied.setup import Setup
from rlinf_jax.tasks.embodied.state import TrainState, stats_size
from rlinf_jax.tasks.env_rl.pools import HostPools, local_copy


@dataclass
class HostState:
    learner: TrainState  # env_state: {"episode_index": [num_envs]} (what a checkpoint holds)
    obs: object  # the batch's current observations: [num_envs, obs], or the camera's pytree


def _put(buf, index, value) -> None:
    """``buf[index] = value`` leaf by leaf (observation pytrees of numpy arrays)."""
    for b, v in zip(jax.tree.leaves(buf), jax.tree.leaves(value)):
        b[index] = v


def _take(tree, index):
    return jax.tree.map(lambda x: x[index], tree)


class HostPPO(HostPools, EnvTrainer):
    def __init__(self, cfg: Config, setup: Setup, placement: Placement, devices):
        if cfg.algorithm.adv_type in GROUP_OUTCOME_ADVANTAGES:
            # Groups share a reset state, which a host simulator's seeds per env do not give.
            raise BadInput(
                f"algorithm.adv_type={cfg.algorithm.adv_type} needs envs that share resets; host simulators "
                "(env.suite=gym) run gae-style estimators: set algorithm.adv_type=gae"
            )
        self.cfg, self.placement = cfg, placement
        # The update's mesh and the rollout's (where the envs' rows and the inference live).
        self.mesh = mesh = component_mesh(placement, "actor", devices)
        self.rollout_mesh = component_mesh(placement, "rollout", devices)
        self.moves = self.rollout_mesh != mesh
        self.env, self.eval_env = setup.env, setup.eval_env  # `HostEnv`s: sizes and worker spec
        self.policy, self._init_params = setup.policy, setup.params
        self.warm_start_metrics = setup.warm_start_metrics
        e = cfg.env
        # Both batches live on the rollout's mesh; the update splits the env batch only.
        check_batch(cfg, setup, self.rollout_mesh)
        if self.env.num_envs % batch_divisor(mesh):
            raise BadInput(
                f"env.num_envs={self.env.num_envs} is not divisible by the {batch_divisor(mesh)} devices of the "
                "actor's mesh; use a multiple or place the actor on fewer devices"
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
        B = self.env.num_envs
        # Every process's rows, so that every process refuses alike.
        by_process = rows_by_process(self.rollout_mesh, B)
        self.rows = by_process.get(jax.process_index(), (0, 0))
        self.eval_rows = process_rows(self.rollout_mesh, self.eval_env.num_envs)
        self.local_envs = local = self.rows[1] - self.rows[0]
        for n in (hi - lo for lo, hi in by_process.values()):
            if n % self.num_micro or e.num_workers > n // self.num_micro:
                where = f"a process's {n} envs (of env.num_envs={B})" if n != B else f"env.num_envs={B}"
                raise BadInput(
                    f"{where} must split into flow.num_micro_batches={self.num_micro} micro-batches of at least "
                    f"env.num_workers={e.num_workers} envs (every worker holds a slice of each)"
                )
        self.micro = local // self.num_micro
        # The algorithm on the actor's mesh: its learner, update and acting functions are the
        # fused runner's; this runner only steps the envs on the host and feeds them.
        self.algorithm = algorithm = PPO(cfg, setup, mesh, evaluates=False)
        self.substeps, self.has_success = algorithm.substeps, algorithm.has_success
        self.env_steps_per_iteration = algorithm.env_steps_per_iteration
        self.T = cfg.algorithm.rollout_length
        self.camera = self.env.camera
        self.learn = jax.jit(algorithm.update, donate_argnums=0)
        self.infer = jax.jit(self._infer)
        self.act_eval = jax.jit(self._act_eval)

    # ------------------------------------------------------------- programs
    def _infer(self, params, stats, obs, rollout_key, t, first_env):
        keys = env_keys(step_keys(rollout_key, self.T)[t], jax.tree.leaves(obs)[0].shape[0], first_env)
        return self.algorithm.policy_fn(params, stats)(obs, keys)

    def _act_eval(self, params, stats, obs):
        return self.algorithm.deterministic(params, stats)(obs)

    # --------------------------------------------------------- observations
    def _obs_spec(self):
        """One env's observation: shape and dtype per leaf."""
        if not self.camera:
            return jax.ShapeDtypeStruct((self.env.observation_size,), jnp.float32)
        shapes = self.env.observation_shapes
        return {"image": jax.ShapeDtypeStruct(shapes["image"], jnp.uint8),
                "tokens": jax.ShapeDtypeStruct(shapes["tokens"], jnp.int32),
                "proprio": jax.ShapeDtypeStruct(shapes["proprio"], jnp.float32)}

    def _obs_struct(self, *lead):
        return jax.tree.map(lambda sd: jax.ShapeDtypeStruct((*lead, *sd.shape), sd.dtype), self._obs_spec())

    def _zeros(self, *lead):
        return jax.tree.map(lambda sd: np.zeros((*lead, *sd.shape), sd.dtype), self._obs_spec())

    def _read(self, pool: HostEnvPool, which: str, sl: slice, copy: bool = True):
        """Observations of envs ``sl`` in ``pool``'s block: ``which`` is "obs" (current) or
        "final_obs" (what a step ended on); copies, or with ``copy=False`` read-only views
        for a caller that copies them on at once (the rollout's numpy buffers; a jitted
        call may read its numpy input after returning, while the workers write the block)."""
        arr = pool.arrays
        own = np.array if copy else np.asarray
        if not self.camera:
            return own(arr[which][sl])
        proprio = own(arr[which][sl])
        image = own(arr["image" if which == "obs" else "final_image"][sl])
        tokens = own(np.broadcast_to(self.env.tokens, (proprio.shape[0], *self.env.tokens.shape)))
        return {"image": image, "tokens": tokens, "proprio": proprio}

    # ---------------------------------------------------------- trainer protocol
    def fresh_state(self) -> TrainState:
        """The state of step 0 as a checkpoint holds it (no worker started)."""
        key = jax.random.PRNGKey(self.cfg.runner.seed)
        key, _ = jax.random.split(key)  # the reset key of a JAX env's fresh state, unused here
        params = jax.tree.map(jnp.copy, self._init_params)
        return TrainState(
            params=params,
            opt_state=self.algorithm.tx.init(params),
            obs_stats=normalization.init_stats(stats_size(self.env, self.policy.normalizable_observations)),
            env_state={"episode_index": np.zeros(self.env.num_envs, np.int32)},
            key=key,
            step=jnp.zeros((), jnp.int32),
            bad_iterations=jnp.zeros((), jnp.int32),
        )

    # What a checkpoint restore reads into, for evaluation (`tasks.embodied.evaluate`).
    checkpoint_target = fresh_state

    def init(self) -> HostState:
        return self.start(self.fresh_state())

    def start(self, ts: TrainState) -> HostState:
        self._open_pool(ts.env_state["episode_index"], self.num_micro)
        learner = replicate(ts.replace(env_state=None), self.mesh)
        obs = self._read(self.pool, "obs", slice(None)) if self.pool is not None else self._zeros(0)
        return HostState(learner=learner, obs=obs)

    def snapshot(self, s: HostState) -> TrainState:
        return s.learner.replace(env_state={"episode_index": self.env_counters()})

    def progress(self, s: HostState) -> tuple[int, int]:
        step, bad = fetch((s.learner.step, s.learner.bad_iterations))
        return int(step), int(bad)

    # ------------------------------------------------------------ placement
    @functools.cached_property
    def _rollout_here(self) -> bool:
        """Whether this process holds a device of the rollout (and so envs of both batches)."""
        return any(d.process_index == jax.process_index() for d in self.rollout_mesh.devices.flat)

    def _for_rollout(self, tree):
        """``tree`` (replicated on the actor's mesh, or host data) as this process's copy on
        its rollout device; None on a process without one. Every process calls it: moving
        between meshes may cross hosts."""
        # Free when already laid out so; it also pins the copy `local_copy` reads to a whole one.
        tree = put(tree, replicated(self.rollout_mesh))
        return local_copy(tree) if self._rollout_here else None

    def _to_actor(self, tree, batch_dim: int):
        """Every process's rows (host arrays, the rollout's cut) as one batch on the actor's mesh."""
        if not is_multiprocess():  # straight onto the actor's devices
            return jax.device_put(tree, batch_sharding(self.mesh, batch_dim))
        tree = from_process_rows(tree, self.rollout_mesh, self.env.num_envs, batch_dim)
        # Across hosts a move goes through every host (`put`): the cost of a rollout placed
        # on other hosts than the update.
        return put(tree, batch_sharding(self.mesh, batch_dim)) if self.moves else tree

    def _split_key(self, key):
        """``(next state key, rollout key, update key)``: split on the host, the same on every
        process; the update's key replicated on the actor's mesh."""
        key, rollout_key, update_key = jax.random.split(jnp.asarray(fetch(key)), 3)
        rep = replicated(self.mesh)
        return put(key, rep), rollout_key, put(update_key, rep)

    @functools.cached_property
    def _policy_outputs(self):
        """Shapes and dtypes of the policy's ``(action, stored action, log-prob[, value])``."""
        ts = jax.eval_shape(self.fresh_state)
        i32 = jax.ShapeDtypeStruct((), jnp.int32)
        return jax.eval_shape(self._infer, ts.params, ts.obs_stats, self._obs_struct(1), ts.key, i32, i32)

    def compile(self, s: HostState, eval_key) -> None:
        ts = s.learner
        local = self._for_rollout((ts.params, ts.obs_stats))
        i32 = jax.ShapeDtypeStruct((), jnp.int32)
        if local is not None:
            params, stats = local
            key = jax.ShapeDtypeStruct(ts.key.shape, ts.key.dtype)
            if self.local_envs:
                self.infer = self.infer.lower(params, stats, self._obs_struct(self.micro), key, i32, i32).compile()
            lo, hi = self.eval_rows
            self.act_eval = self.act_eval.lower(params, stats, self._obs_struct(hi - lo)).compile()
        outs = self._policy_outputs
        T, B = self.T, self.env.num_envs
        rows, last_rows = batch_sharding(self.mesh, 1), batch_sharding(self.mesh, 0)
        f = lambda *shape: jax.ShapeDtypeStruct((T, B, *shape), jnp.float32, sharding=rows)  # noqa: E731
        # The stored action and log-prob as the policy gives them (a VLA: int32 bins, and
        # log-probs per chunk, action or token).
        g = lambda x: jax.ShapeDtypeStruct((T, B, *x.shape[1:]), x.dtype, sharding=rows)  # noqa: E731
        split = lambda tree, s: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree)  # noqa: E731
        traj = Transition(
            obs=split(self._obs_struct(T, B), rows), raw_action=g(outs[1]), logprob=g(outs[2]), reward=f(),
            done=f(), truncated=f(), final_obs=split(self._obs_struct(T, B), rows), episode_return=f(),
            episode_length=jax.ShapeDtypeStruct((T, B), jnp.int32, sharding=rows), episode_success=f(),
            value=f() if len(outs) > 3 else None,
        )
        last = split(self._obs_struct(B), last_rows)
        self.learn = self.learn.lower(ts, traj, last, ts.key).compile()

    def rollout(self, s: HostState, rollout_key):
        """One rollout of this process's envs acting with ``s``'s parameters: ``(trajectory
        [T, local envs], last observations)`` as host arrays. Every process calls it."""
        local = self._for_rollout((s.learner.params, s.learner.obs_stats))
        if local is not None:  # the key beside the parameters, on this process's rollout device
            rollout_key = jax.device_put(rollout_key, jax.tree.leaves(local)[0].sharding)
        return self._rollout(s, local, rollout_key)

    def _rollout(self, s: HostState, local, rollout_key):
        """One rollout of ``T`` steps of this process's envs, micro-batch by micro-batch (see
        the module's doc), acting with ``local`` (`_for_rollout`'s parameters and statistics)."""
        pool, T, B, mb = self.pool, self.T, self.local_envs, self.micro
        outs = self._policy_outputs
        buf = {k: np.zeros((T, B), np.float32) for k in ("reward", "done", "truncated", "episode_return",
                                                        "episode_success", "value")}
        buf["episode_length"] = np.zeros((T, B), np.int32)
        buf["obs"] = self._zeros(T, B)
        buf["final_obs"] = self._zeros(T, B)
        # The stored action's own dtype: a VLA stores int32 bin indices.
        raw = np.zeros((T, B, *outs[1].shape[1:]), outs[1].dtype)
        buf["logprob"] = np.zeros((T, B, *outs[2].shape[1:]), outs[2].dtype)
        has_value = len(outs) > 3
        obs = s.obs
        first = self.rows[0]  # the global index of this process's env 0 (the policy's keys follow it)

        def collect(t, sl):  # the results of step t of micro-batch sl, once its workers answered
            arr = pool.arrays
            for k in ("reward", "done", "truncated", "episode_return", "episode_length", "episode_success"):
                buf[k][t, sl] = arr[k][sl]
            _put(buf["final_obs"], (t, sl), self._read(pool, "final_obs", sl, copy=False))
            _put(obs, sl, self._read(pool, "obs", sl, copy=False))

        for t in range(T if B else 0):
            params, stats = local
            for m in range(self.num_micro):
                sl = pool.group(m)
                if t:
                    pool.wait(m)
                    collect(t - 1, sl)
                _put(buf["obs"], (t, sl), _take(obs, sl))
                out = self.infer(params, stats, _take(obs, sl), rollout_key, np.int32(t), np.int32(first + m * mb))
                action, raw_m, logprob, *value = jax.device_get(out)
                pool.arrays["action"][sl] = action.reshape(action.shape[0], -1)  # a VLA's [mb, 1, act] chunk
                pool.send(m)
                raw[t, sl] = raw_m
                buf["logprob"][t, sl] = logprob
                if value:
                    buf["value"][t, sl] = value[0]
        for m in range(self.num_micro if B else 0):
            sl = pool.group(m)
            pool.wait(m)
            collect(T - 1, sl)
        traj = Transition(
            obs=buf["obs"], raw_action=raw, logprob=buf["logprob"], reward=buf["reward"], done=buf["done"],
            truncated=buf["truncated"], final_obs=buf["final_obs"], episode_return=buf["episode_return"],
            episode_length=buf["episode_length"], episode_success=buf["episode_success"],
            value=buf["value"] if has_value else None,
        )
        return traj, jax.tree.map(np.copy, obs)

    def run_iterations(self, s: HostState, n: int):
        sums = None
        for _ in range(n):
            key, rollout_key, update_key = self._split_key(s.learner.key)
            traj, last_obs = self.rollout(s, rollout_key)
            # Every process's rows of the rollout, one batch on the actor's mesh for the update.
            traj, last_obs = self._to_actor(traj, 1), self._to_actor(last_obs, 0)
            learner, metrics = self.learn(s.learner.replace(key=key), traj, last_obs, update_key)
            s.learner = learner
            sums = metrics if sums is None else jax.tree.map(jnp.add, sums, metrics)
        return s, sums

    def run_eval(self, s: HostState, key) -> dict:
        return self.evaluate(s.learner.params, s.learner.obs_stats, key)

    # An evaluation of a host simulator draws no episode strip (camera runs not yet either).
    image_observations = False

    def deterministic(self, params, stats):
        """``obs -> action``: the policy's evaluation action."""
        return lambda obs: self._act_eval(params, stats, obs)

    def policy_fn(self, params, stats):
        return self.algorithm.policy_fn(params, stats)

    def evaluate(self, params, stats, key) -> dict:
        """One deterministic episode per eval env, each from a seed drawn from ``key``."""
        local = self._for_rollout((params, stats))
        act = lambda pool: self.act_eval(*local, self._read(pool, "obs", slice(None)))  # noqa: E731
        episodes = self.eval_episodes(act, key)
        out = {
            "eval/return": float(np.mean(episodes["return"])),
            "eval/return_std": float(np.std(episodes["return"])),
            "eval/episode_length": float(np.mean(episodes["length"])) * self.substeps,
        }
        if self.has_success:
            out["eval/success"] = float(np.mean(episodes["success"]))
        return out

    def summarize(self, sums, n):
        return self.algorithm.summarize(sums, n)
