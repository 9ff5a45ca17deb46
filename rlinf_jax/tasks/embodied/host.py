"""Embodied PPO on a host simulator: env workers step in C while the policy infers in XLA.

    workers (group m)   step micro-batch m  ---- obs in shared memory ---->
    this process        infer micro-batch m+1 (jit)  ...  ppo.learn (jit) on the whole rollout

A host env cannot be stepped inside `jit`, so the rollout is a host loop: for each step
and each of the ``flow.num_micro_batches`` micro-batches, wait for that micro-batch's
workers, infer its actions, write them into shared memory and let the workers step it.
With two micro-batches the workers step one half while the policy infers the other
(RLinf's ``pipeline_stage_num``); every worker holds envs of both halves, so each half
is stepped by all of them. With one micro-batch they take turns.

The maths is the fused trainer's: the same `ppo.Learner` and `ppo.learn`, and the policy's
keys folded from each env's global index and the step exactly as in `rollout.unroll`,
with env resets seeded per global env index in the workers, so the number of
micro-batches or workers changes no number.

With a camera (``env.camera``) an observation is the tabletop's structure,
``{"image", "tokens", "proprio"}``: the workers' uint8 images and state vectors from the
shared block, the task's fixed instruction tokens added here; every buffer below is that
pytree instead of one array.

On several devices the update is data-parallel: the rollout's rows split over the mesh's
batch axes. In a multi-host run (`rlinf_jax.launch`) each process opens workers for the
envs whose rows its devices hold (seeded by their global indices), infers on its own
device with its copy of the replicated parameters, and the update joins every process's
rows into global arrays; the evaluation's envs split the same way. So one process, or
several, give the same numbers up to float summation order.

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

from rlinf_jax.algos import GROUP_OUTCOME_ADVANTAGES, get_advantage, get_policy_loss
from rlinf_jax.config.schema import Config
from rlinf_jax.envs import normalization
from rlinf_jax.envs.host import HostEnvPool
from rlinf_jax.errors import BadInput
from rlinf_jax.flow.trainer import Trainer
from rlinf_jax.rollout import Transition, env_keys, step_keys
from rlinf_jax.runtime.distributed import is_multiprocess
from rlinf_jax.sharding import batch_divisor, batch_sharding, fetch, from_process_rows, process_rows, replicate
from rlinf_jax.tasks.embodied import ppo, setup as setup_lib
from rlinf_jax.tasks.embodied.setup import Setup
from rlinf_jax.tasks.embodied.state import TrainState, stats_size
from rlinf_jax.tasks.embodied.trainer import check_batch


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


def _local(tree):
    """This process's copy of replicated arrays: a jitted call on them and on host data of
    this process alone runs on its own device, with no collective."""
    return jax.tree.map(lambda x: x.addressable_data(0) if isinstance(x, jax.Array) else x, tree)


class HostPools:
    """The worker pools of a host-simulator trainer: the training batch's (``pool``) and
    the evaluation's (``eval_pool``, opened at the first evaluation), their restarts
    counted across reopenings, and deterministic evaluation episodes. Its subclass sets
    ``cfg``, ``mesh``, ``env`` and ``eval_env`` (`HostEnv`s), and in a multi-host run
    ``rows`` / ``eval_rows``, this process's ``[lo, hi)`` of each batch."""

    pool: HostEnvPool | None = None
    eval_pool: HostEnvPool | None = None
    _restarts_before = 0
    rows: tuple[int, int] | None = None  # None: every env of the batch
    eval_rows: tuple[int, int] | None = None

    def _rows(self, which: str) -> tuple[int, int]:
        rows = getattr(self, which)
        return rows if rows is not None else (0, (self.env if which == "rows" else self.eval_env).num_envs)

    def _open_pool(self, episode_index, num_groups: int = 1) -> None:
        """The training pool (this process's envs), every env starting the episode its
        checkpointed counter names (``episode_index``: every env's, a global array or host data)."""
        episode_index = np.asarray(fetch(episode_index))
        if episode_index.shape != (self.env.num_envs,):
            raise BadInput(
                f"the checkpoint holds {episode_index.shape[0]} envs' episode counters but env.num_envs="
                f"{self.env.num_envs}; resume with the run's env.num_envs"
            )
        e = self.cfg.env
        lo, hi = self._rows("rows")
        self._close_pool("pool")
        self.pool = HostEnvPool(
            self.env.spec, hi - lo, e.num_workers, seed=self.cfg.runner.seed, num_groups=num_groups,
            episode_index=episode_index[lo:hi], step_timeout_s=e.step_timeout_s, first_env=lo,
        )

    def env_counters(self):
        """Every env's episode counter, for a checkpoint: this process's from its pool, as
        one global array in a multi-host run (each process writes its rows)."""
        counters = self.pool.arrays["episode_index"].astype(np.int32)
        if is_multiprocess():
            counters = from_process_rows(counters, self.mesh, self.env.num_envs)
        return counters

    def _close_pool(self, name: str) -> None:
        pool = getattr(self, name)
        if pool is not None:
            self._restarts_before += pool.restarts
            setattr(self, name, None)
            pool.close()

    def eval_episodes(self, act, key) -> dict:
        """One episode per eval env under ``act`` (observations of the eval pool -> actions
        [n, ...]), each from a seed drawn from ``key``: return, length and success per env
        (every env's, on every process of a multi-host run)."""
        e = self.cfg.env
        lo, hi = self._rows("eval_rows")
        n = hi - lo
        if self.eval_pool is None:
            self.eval_pool = HostEnvPool(
                self.eval_env.spec, n, min(e.num_workers, n), seed=0, step_timeout_s=e.step_timeout_s, first_env=lo,
            )
        pool = self.eval_pool
        pool.reset(int(jax.random.randint(key, (), 0, 2**31 - 1)))
        ret, length, alive, success = np.zeros(n), np.zeros(n), np.ones(n), np.zeros(n)
        for _ in range(self.env.spec.time_limit):
            action = np.asarray(act(pool))
            pool.step(action.reshape(action.shape[0], -1))
            ret += pool.arrays["reward"] * alive
            length += alive
            ended = alive * pool.arrays["done"]
            success = np.where(ended > 0, pool.arrays["episode_success"], success)
            alive *= 1.0 - pool.arrays["done"]
            if not alive.any():
                break
        out = {"return": ret, "length": length, "success": success}
        if is_multiprocess():
            out = fetch(from_process_rows(out, self.mesh, self.eval_env.num_envs))
        return out

    def flow_stats(self) -> dict[str, float]:
        restarts = self._restarts_before + sum(p.restarts for p in (self.pool, self.eval_pool) if p is not None)
        return {"env/worker_restarts": float(restarts)}

    def close(self) -> None:
        self._close_pool("pool")
        self._close_pool("eval_pool")



class HostPPO(HostPools, Trainer):
    def __init__(self, cfg: Config, setup: Setup, mesh):
        if cfg.algorithm.adv_type in GROUP_OUTCOME_ADVANTAGES:
            # Groups share a reset state, which a host simulator's seeds per env do not give.
            raise BadInput(
                f"algorithm.adv_type={cfg.algorithm.adv_type} needs envs that share resets; host simulators "
                "(env.suite=gym) run gae-style estimators: set algorithm.adv_type=gae"
            )
        self.cfg, self.mesh = cfg, mesh
        self.env, self.eval_env = setup.env, setup.eval_env  # `HostEnv`s: sizes and worker spec
        self.policy, self.graphdef, self._init_params = setup.policy, setup.graphdef, setup.params
        self.warm_start_metrics = setup.warm_start_metrics
        e = cfg.env
        check_batch(cfg, setup, mesh)
        self.num_micro = cfg.flow.num_micro_batches
        B = self.env.num_envs
        self.rows, self.eval_rows = process_rows(mesh, B), process_rows(mesh, self.eval_env.num_envs)
        self.local_envs = local = self.rows[1] - self.rows[0]
        where = f" of this process's {local}" if local != B else ""
        if local % self.num_micro or e.num_workers > local // self.num_micro:
            raise BadInput(
                f"env.num_envs={B}{where} must split into flow.num_micro_batches={self.num_micro} micro-batches "
                f"of at least env.num_workers={e.num_workers} envs (every worker holds a slice of each)"
            )
        self.micro = local // self.num_micro
        self.substeps = e.action_repeat
        self.T = cfg.algorithm.rollout_length
        self.has_success = self.env.spec.has_success
        self.camera = self.env.camera
        settings = ppo.PPOSettings.from_config(cfg, B, self.substeps, 0)
        self.env_steps_per_iteration = settings.batch_size * self.substeps
        self.tx = setup_lib.optimizer(cfg)
        a = cfg.algorithm
        mb_sharding = None
        if settings.minibatch_size % batch_divisor(mesh) == 0:
            mb_sharding = batch_sharding(mesh, batch_dim=1)
        self.learner = ppo.Learner(
            self.policy, self.graphdef, self.tx, settings, get_advantage(a.adv_type), get_policy_loss(a.loss_type),
            mb_sharding,
        )
        self.learn = jax.jit(functools.partial(ppo.learn, self.learner), donate_argnums=0)
        self.infer = jax.jit(self._infer)
        self.act_eval = jax.jit(self._act_eval)

    # ------------------------------------------------------------- programs
    def _infer(self, params, stats, obs, rollout_key, t, first_env):
        keys = env_keys(step_keys(rollout_key, self.T)[t], jax.tree.leaves(obs)[0].shape[0], first_env)
        return ppo.acting(self.learner, params, stats)(obs, keys)

    def _act_eval(self, params, stats, obs):
        model = self.learner.model(params)
        return self.policy.act_deterministic(model, ppo.normalize(self.learner.settings, stats, obs))

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
            opt_state=self.tx.init(params),
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
        return HostState(learner=learner, obs=self._read(self.pool, "obs", slice(None)))

    def snapshot(self, s: HostState) -> TrainState:
        return s.learner.replace(env_state={"episode_index": self.env_counters()})

    def progress(self, s: HostState) -> tuple[int, int]:
        return int(s.learner.step), int(s.learner.bad_iterations)

    def compile(self, s: HostState, eval_key) -> None:
        ts = s.learner
        params, stats, key = _local((ts.params, ts.obs_stats, ts.key))
        obs = self._obs_struct(self.micro)
        i32 = jax.ShapeDtypeStruct((), jnp.int32)
        self.infer = self.infer.lower(params, stats, obs, key, i32, i32).compile()
        outs = jax.eval_shape(self._infer, params, stats, obs, key, i32, i32)
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
        lo, hi = self.eval_rows
        self.act_eval = self.act_eval.lower(params, stats, self._obs_struct(hi - lo)).compile()

    def _rollout(self, s: HostState, rollout_key):
        """One rollout of ``T`` steps, micro-batch by micro-batch (see the module's doc)."""
        pool, T, B, mb = self.pool, self.T, self.local_envs, self.micro
        arr = pool.arrays
        buf = {k: np.zeros((T, B), np.float32) for k in ("reward", "done", "truncated", "episode_return",
                                                        "episode_success", "value")}
        buf["episode_length"] = np.zeros((T, B), np.int32)
        buf["obs"] = self._zeros(T, B)
        buf["final_obs"] = self._zeros(T, B)
        raw = None
        obs = s.obs
        params, stats, rollout_key = _local((s.learner.params, s.learner.obs_stats, rollout_key))
        first = self.rows[0]  # the global index of this process's env 0 (the policy's keys follow it)
        has_value = False

        def collect(t, sl):  # the results of step t of micro-batch sl, once its workers answered
            for k in ("reward", "done", "truncated", "episode_return", "episode_length", "episode_success"):
                buf[k][t, sl] = arr[k][sl]
            _put(buf["final_obs"], (t, sl), self._read(pool, "final_obs", sl, copy=False))
            _put(obs, sl, self._read(pool, "obs", sl, copy=False))

        for t in range(T):
            for m in range(self.num_micro):
                sl = pool.group(m)
                if t:
                    pool.wait(m)
                    collect(t - 1, sl)
                _put(buf["obs"], (t, sl), _take(obs, sl))
                out = self.infer(params, stats, _take(obs, sl), rollout_key, np.int32(t), np.int32(first + m * mb))
                action, raw_m, logprob, *value = jax.device_get(out)
                if raw is None:
                    # The stored action's own dtype: a VLA stores int32 bin indices.
                    raw = np.zeros((T, B, *raw_m.shape[1:]), raw_m.dtype)
                    buf["logprob"] = np.zeros((T, B, *logprob.shape[1:]), logprob.dtype)
                arr["action"][sl] = action.reshape(action.shape[0], -1)  # a VLA's [mb, 1, act] chunk
                pool.send(m)
                raw[t, sl] = raw_m
                buf["logprob"][t, sl] = logprob
                if value:
                    has_value = True
                    buf["value"][t, sl] = value[0]
        for m in range(self.num_micro):
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
            key, rollout_key, update_key = jax.random.split(s.learner.key, 3)
            traj, last_obs = self._rollout(s, rollout_key)
            # Every process's rows of the rollout, one global batch for the update.
            B = self.env.num_envs
            traj, last_obs = from_process_rows(traj, self.mesh, B, batch_dim=1), from_process_rows(last_obs, self.mesh, B)
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
        return ppo.acting(self.learner, params, stats)

    def evaluate(self, params, stats, key) -> dict:
        """One deterministic episode per eval env, each from a seed drawn from ``key``."""
        params, stats = _local((params, stats))
        episodes = self.eval_episodes(lambda pool: self.act_eval(params, stats, self._read(pool, "obs", slice(None))), key)
        out = {
            "eval/return": float(np.mean(episodes["return"])),
            "eval/return_std": float(np.std(episodes["return"])),
            "eval/episode_length": float(np.mean(episodes["length"])) * self.substeps,
        }
        if self.has_success:
            out["eval/success"] = float(np.mean(episodes["success"]))
        return out

    def summarize(self, sums, n):
        return ppo.summarize(sums, n, self.substeps, self.has_success)
