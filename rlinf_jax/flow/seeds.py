"""Seeds side by side: several independent runs of one recipe trained in one program.

`runner.seeds: [0, 1, 2, 3]` (or `runner.num_seeds: 4`, which counts up from
`runner.seed`) stacks the runs' states on a leading seed axis and `jax.vmap`s the
algorithm's chunk and evaluation over it. Each run starts from what the same seed alone
starts from (its own initial parameters, env resets and keys) and takes the same steps,
so its numbers are those of the seed trained alone, up to the float reassociation of a
batched matrix product. On a CPU the seed axis turns a small policy's 64-row products
into ``64 x seeds``-row ones, which keep every core busy; on several devices the seed axis
stays whole and each run's env batch is split as it would be alone.

Metrics are logged three ways: ``key`` is the mean over the seeds, ``key@ci95`` the
half-width of its 95% confidence interval (Student's t over the seeds) and ``key@seedS``
each run's own value. Checkpoints hold every seed's state and the list of seeds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from scipy import special

from rlinf_jax.errors import BadInput
from rlinf_jax.flow.algorithm import Algorithm
from rlinf_jax.flow.trainer import EnvTrainer
from rlinf_jax.runtime.metrics import CI, SEED
from rlinf_jax.sharding import Placement
from rlinf_jax.sharding.mesh import put



def resolve_seeds(runner) -> tuple[int, ...]:
    """The seeds of a run: ``runner.seeds`` when given, else ``runner.num_seeds`` seeds
    counting up from ``runner.seed`` (one seed, ``runner.seed``, by default)."""
    seeds, n = list(runner.seeds), runner.num_seeds
    if n < 1:
        raise BadInput(f"runner.num_seeds={n} must be at least 1")
    if seeds:
        if n not in (1, len(seeds)):
            raise BadInput(f"runner.seeds lists {len(seeds)} seeds but runner.num_seeds={n}; give one of the two")
        if len(set(seeds)) != len(seeds):
            raise BadInput(f"runner.seeds={seeds} repeats a seed; every run of a batch needs its own")
        if any(not 0 <= s < 2**31 - 1 for s in seeds):
            raise BadInput(f"runner.seeds={seeds}: seeds must be integers in [0, 2^31 - 2]")
        if len(seeds) == 1 and seeds[0] != runner.seed:
            raise BadInput(f"runner.seeds={seeds} lists one seed: set runner.seed={seeds[0]} instead")
        return tuple(int(s) for s in seeds)
    return tuple(range(runner.seed, runner.seed + n))


def interval(values: Sequence[float]) -> tuple[float, float]:
    """``(mean, half-width)`` of the 95% confidence interval of the mean of ``values``
    (Student's t with ``n - 1`` degrees of freedom; half-width 0 for one value)."""
    x = np.asarray(values, np.float64)
    mean = float(np.mean(x))
    if x.size < 2:
        return mean, 0.0
    half = float(special.stdtrit(x.size - 1, 0.975) * np.std(x, ddof=1) / math.sqrt(x.size))
    return mean, half


def combine(per_seed: Sequence[dict], seeds: Sequence[int]) -> dict[str, float]:
    """Each run's metrics -> the mean over the runs, its interval and every run's value
    (a key some runs lack, such as an episode return before any episode ended, is
    combined over the runs that have it)."""
    out: dict[str, float] = {}
    for key in dict.fromkeys(k for m in per_seed for k in m):
        have = [(s, float(m[key])) for s, m in zip(seeds, per_seed) if key in m]
        mean, half = interval([v for _, v in have])
        out[key], out[key + CI] = mean, half
        out.update({f"{key}{SEED}{s}": v for s, v in have})
    return out


def described(metrics: dict, key: str, fmt: str = ".3g") -> str:
    """``"912 ± 31 (4 seeds)"`` for a combined metric, ``"912"`` for a single run's."""
    if key + CI not in metrics:
        return format(metrics[key], fmt)
    runs = sum(1 for k in metrics if k.startswith(key + SEED))
    return f"{format(metrics[key], fmt)} ± {format(metrics[key + CI], fmt)} ({runs} seeds)"


def stack(trees: Sequence[Any]) -> Any:
    """Trees of equal structure -> one tree whose leaves gain a leading seed axis."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def unstack(tree: Any, i: int) -> Any:
    """The ``i``-th run of a stacked tree."""
    return jax.tree.map(lambda x: x[i], tree)


def with_seed_axis(shardings: Any) -> Any:
    """A run's shardings with a leading, unsplit seed axis (each run's arrays laid out as
    they are alone)."""
    return jax.tree.map(lambda s: NamedSharding(s.mesh, P(None, *s.spec)), shardings,
                        is_leaf=lambda s: isinstance(s, NamedSharding))


def eval_key(seed: int, step) -> jax.Array:
    """The evaluation key of the run with ``seed`` at ``step`` (the same whatever the
    chunking, the resume point or the runs beside it)."""
    return jax.random.fold_in(jax.random.PRNGKey(seed + 1), step)


def eval_step(runner, step):
    """The step whose evaluation episodes a run plays at ``step``: ``step`` itself, or 0 at
    every step with ``runner.eval_episodes=fixed``."""
    return 0 if runner.eval_episodes == "fixed" else step


def seed_keys(batch: SeedBatch, key) -> jax.Array:
    """One key for every run of ``batch``: the same episodes for each (a fixed protocol)."""
    return jnp.broadcast_to(key, (batch.num_runs, *jnp.shape(key)))


class SeedBatch(EnvTrainer):
    """Runs of one algorithm side by side: ``len(seeds)`` states on a leading axis, the
    algorithm's chunk and evaluation vmapped over it (the fused runner, batched)."""

    def __init__(self, algorithm: Algorithm, seeds: Sequence[int], placement: Placement | None = None):
        self.algorithm, self.seeds, self.placement = algorithm, tuple(seeds), placement
        self.num_runs = len(self.seeds)
        self.cfg = algorithm.cfg
        axes = (0,) + (None,) * (len(algorithm.chunk_args) + 1)
        self._run_chunk = jax.jit(jax.vmap(algorithm.chunk, in_axes=axes), donate_argnums=0)
        self._evaluate = jax.jit(jax.vmap(lambda state, key: algorithm.evaluate(*algorithm.eval_args(state), key)))
        self._seed_array = jnp.asarray(self.seeds, jnp.int32)

    # What the embodied and off-policy loops read of their trainer, the algorithm's.
    @property
    def env_steps_per_iteration(self) -> int:
        return self.algorithm.env_steps_per_iteration

    @property
    def image_observations(self) -> bool:
        return self.algorithm.image_observations

    @property
    def warm_start_metrics(self) -> dict | None:
        return self.algorithm.warm_start_metrics  # already combined over the seeds

    def strip(self, state, key, episodes: int):
        """The first run's episode strip (what TensorBoard shows)."""
        return self.algorithm.strip(unstack(state, 0), key, episodes)

    # ---------------------------------------------------------------- protocol
    def place(self, state):
        return put(state, with_seed_axis(self.algorithm.shardings(unstack(state, 0))))

    def init(self):
        return self.place(stack([self.algorithm.fresh_state(s) for s in self.seeds]))

    def start(self, restored):
        runs = [self.algorithm.complete(unstack(restored, i)) for i in range(self.num_runs)]
        return self.place(stack(runs))

    def snapshot(self, state):
        return self.algorithm.snapshot(state)  # the algorithm's snapshot only drops fields

    def progress(self, state) -> tuple[int, int]:
        steps = np.asarray(jax.device_get(state.step))
        return int(steps[0]), int(np.max(jax.device_get(state.bad_iterations)))

    def eval_keys(self, state) -> jax.Array:
        step = eval_step(self.cfg.runner, jnp.asarray(state.step)[0])
        return jax.vmap(lambda s: eval_key(s, step))(self._seed_array)

    def compile(self, state, eval_key) -> None:
        args = self.algorithm.chunk_args
        self._chunk = self._run_chunk.lower(state, *args, jnp.int32(1)).compile()
        self._eval = self._evaluate.lower(state, self.eval_keys(state)).compile()

    def run_iterations(self, state, n: int):
        return self._chunk(state, *self.algorithm.chunk_args, jnp.int32(n))

    def run_eval(self, state, key=None) -> dict:
        """Every run's evaluation with its own key (``key`` is the loop's, unused: each run
        evaluates the episodes it would alone), combined."""
        return self.evaluate_runs(state, self.eval_keys(state))

    def evaluate_runs(self, state, keys) -> dict:
        """The runs' evaluations with the given per-run keys ``[seeds, 2]``, combined."""
        per_run = jax.device_get(self._evaluate(state, keys))
        return combine([{k: float(v[i]) for k, v in per_run.items()} for i in range(self.num_runs)], self.seeds)

    def summarize(self, sums: dict, n: int) -> dict[str, float]:
        runs = [self.algorithm.summarize(unstack(sums, i), n) for i in range(self.num_runs)]
        return combine(runs, self.seeds)

    def meta(self) -> dict:
        return {**self.algorithm.meta(), "seeds": list(self.seeds)}

    def load_meta(self, meta: dict) -> None:
        saved = meta.get("seeds")
        if saved is not None and list(saved) != list(self.seeds):
            raise BadInput(
                f"the checkpoint holds the runs of seeds {saved}, this run asks for {list(self.seeds)}; "
                f"resume with runner.seeds={saved}"
            )


def runner_info(trainer: EnvTrainer) -> dict:
    """What placement.json says of the runner: its class and its algorithm's, and for seeds
    side by side the seeds."""
    info = {"runner": type(trainer).__name__}
    if trainer.algorithm is not None:
        info["algorithm"] = type(trainer.algorithm).__name__
    if isinstance(trainer, SeedBatch):
        info["seeds"] = list(trainer.seeds)
    return info


def seed_batch(runner: EnvTrainer, seeds: Sequence[int], why_not: Callable[[], str | None]) -> EnvTrainer:
    """``runner`` itself for one seed, else its algorithm's runs side by side in its
    placement; ``why_not`` names what keeps this run from batching its seeds (None: nothing)."""
    if len(seeds) == 1:
        return runner
    reason = why_not()
    if reason is not None:
        runner.close()
        raise BadInput(f"runner.seeds trains {len(seeds)} runs side by side in the fused runner; {reason}")
    return SeedBatch(runner.algorithm, seeds, runner.placement)
