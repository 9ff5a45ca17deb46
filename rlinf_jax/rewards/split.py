"""Rewards in a multi-host run: each process scores its own rows, every process gets all.

Not imported by ``rlinf_jax.rewards`` itself: it needs JAX, which checker processes do not.

Every process of a multi-host job holds the whole rollout batch on the host (the data
loader is seeded alike everywhere and `fetch` gathers the sampled tokens), and every
process needs the same rewards: they decide advantages, dynamic sampling's refills and
what goes into the update on every host. Scoring all rows on every process would give
the same numbers only as long as no check times out, and a timeout depends on the load
of the host. So process ``p`` scores its contiguous share of the rows, and one
all-gather hands everyone the per-row results and the metrics; with one process this is
the reward function itself.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils

from rlinf_jax.rewards.reward_fn import RewardFunction, RewardResult

# Metrics that count rows rather than average over them: summed over the processes.
COUNTS = ("reward/errors", "reward/timeouts")


def row_share(n: int, process: int, processes: int) -> tuple[int, int]:
    """The rows ``[lo, hi)`` that ``process`` scores: contiguous, sizes differing by at most 1."""
    bounds = np.linspace(0, n, processes + 1).round().astype(int)
    return int(bounds[process]), int(bounds[process + 1])


def combine(parts: list[tuple[int, int, RewardResult]], n: int) -> RewardResult:
    """The result of ``n`` rows from per-process results of ``[lo, hi)`` shares.

    Per-row arrays are laid side by side; mean metrics are weighted by share size, counts summed.
    """
    rewards = np.zeros(n, np.float32)
    correct = np.zeros(n, np.float32)
    failed = np.zeros(n, bool)
    for lo, hi, r in parts:
        rewards[lo:hi], correct[lo:hi], failed[lo:hi] = r.rewards, r.correct, r.failed
    metrics = {}
    for key in parts[0][2].metrics:
        if key in COUNTS:
            metrics[key] = float(sum(r.metrics[key] for _, _, r in parts))
        else:
            metrics[key] = float(sum(r.metrics[key] * (hi - lo) for lo, hi, r in parts) / n) if n else 0.0
    return RewardResult(rewards=rewards, metrics=metrics, correct=correct, failed=failed)


class SplitRewards:
    """``RewardFunction``'s interface; in a multi-host job the rows are shared out (see above).

    Every process must call it at the same point with the same rows (it holds a collective).
    """

    def __init__(self, reward_fn: RewardFunction):
        self.reward_fn = reward_fn

    def __call__(self, responses, answers, lengths=None) -> RewardResult:
        if jax.process_count() == 1:
            return self.reward_fn(responses, answers, lengths)
        n, P = len(responses), jax.process_count()
        lo, hi = row_share(n, jax.process_index(), P)
        mine = self.reward_fn(
            list(responses[lo:hi]), list(answers[lo:hi]), None if lengths is None else np.asarray(lengths)[lo:hi]
        )
        keys = list(mine.metrics)  # the config decides them: the same on every process
        rows = np.zeros((3, n), np.float32)
        rows[:, lo:hi] = mine.rewards, mine.correct, mine.failed
        stats = np.asarray([mine.metrics[k] for k in keys], np.float32)
        all_rows, all_stats = multihost_utils.process_allgather((rows, stats))
        parts = []
        for p in range(P):
            plo, phi = row_share(n, p, P)
            r = all_rows[p]
            parts.append((plo, phi, RewardResult(
                rewards=r[0, plo:phi], correct=r[1, plo:phi], failed=r[2, plo:phi] > 0.5,
                metrics=dict(zip(keys, all_stats[p].tolist())),
            )))
        return combine(parts, n)

    def close(self) -> None:
        self.reward_fn.close()
