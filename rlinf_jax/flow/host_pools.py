"""The worker pools of a runner on a host simulator (`envs.host.HostEnvPool`, each opened by
its env: `HostEnv.open_pool`): the training batch's and the evaluation's, their restarts
counted across reopenings, and deterministic evaluation episodes. The host runner
(`flow.host.Host`) mixes in `HostPools`."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from rlinf_jax.config.schema import EnvConfig
from rlinf_jax.errors import BadInput
from rlinf_jax.runtime.distributed import is_multiprocess
from rlinf_jax.sharding import fetch, from_process_rows


def local_copy(tree):
    """This process's copy of replicated arrays: a jitted call on them and on host data of
    this process alone runs on its own device, with no collective."""
    return jax.tree.map(lambda x: x.addressable_data(0) if isinstance(x, jax.Array) else x, tree)


def pool_limits(e: EnvConfig) -> dict:
    """A worker pool's deadlines and restart cap, from the ``env:`` section ``e``."""
    return {"step_timeout_s": e.step_timeout_s, "start_timeout_s": e.worker_start_timeout_s,
            "max_restarts": e.max_worker_restarts}


class HostPools:
    """The worker pools of a host-simulator trainer: the training batch's (``pool``) and
    the evaluation's (``eval_pool``, opened at the first evaluation), their restarts
    counted across reopenings, and deterministic evaluation episodes. Its subclass sets
    ``cfg``, ``mesh``, ``env`` and ``eval_env`` (`HostEnv`s), and in a multi-host run
    ``rows`` / ``eval_rows``, this process's ``[lo, hi)`` of each batch."""

    pool: Any = None  # an `envs.host.HostEnvPool`, once opened
    eval_pool: Any = None
    _restarts_before = 0
    rows: tuple[int, int] | None = None  # None: every env of the batch
    eval_rows: tuple[int, int] | None = None
    rollout_mesh = None  # the mesh ``rows`` are cut over (None: ``mesh``)

    @property
    def rows_mesh(self):
        return self.mesh if self.rollout_mesh is None else self.rollout_mesh

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
        if hi == lo:
            return  # a process of a multi-host run that steps no env
        self.pool = self.env.open_pool(
            hi - lo, e.num_workers, seed=self.cfg.runner.seed, num_groups=num_groups,
            episode_index=episode_index[lo:hi], first_env=lo, **pool_limits(e),
        )

    def env_counters(self):
        """Every env's episode counter, for a checkpoint: this process's from its pool, as
        one global array in a multi-host run (each process writes its rows)."""
        counters = np.zeros(0, np.int32) if self.pool is None else self.pool.arrays["episode_index"].astype(np.int32)
        if is_multiprocess():
            counters = from_process_rows(counters, self.rows_mesh, self.env.num_envs)
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
        ret, length, alive, success = np.zeros(n), np.zeros(n), np.ones(n), np.zeros(n)
        if n:
            if self.eval_pool is None:
                self.eval_pool = self.eval_env.open_pool(
                    n, min(e.num_workers, n), seed=0, first_env=lo, **pool_limits(e),
                )
            pool = self.eval_pool
            pool.reset(int(jax.random.randint(key, (), 0, 2**31 - 1)))
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
            out = fetch(from_process_rows(out, self.rows_mesh, self.eval_env.num_envs))
        return out

    def flow_stats(self) -> dict[str, float]:
        restarts = self._restarts_before + sum(p.restarts for p in (self.pool, self.eval_pool) if p is not None)
        return {"env/worker_restarts": float(restarts)}

    def close(self) -> None:
        self._close_pool("pool")
        self._close_pool("eval_pool")
