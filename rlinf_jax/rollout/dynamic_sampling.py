"""DAPO's dynamic sampling on the host: keep drawing prompt groups until the batch is
full of informative ones (groups whose rewards are not all equal).

The sampler is the rollout + reward stage of a reasoning flow; this loop only decides
which groups to keep. Batches keep a static shape so the jitted update never recompiles:
when ``max_resample`` rounds still leave the batch short, the remaining slots are filled
with the latest uninformative groups (zero GRPO advantage, so they add no gradient) and
the shortfall is reported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from rlinf_jax.algos.dapo import informative_groups


@dataclass
class SamplingReport:
    rounds: int  # sampler calls made (1 = the first draw was enough)
    sampled_groups: int
    informative_groups: int  # kept informative groups (<= the batch's group count)
    filled: bool  # the batch holds only informative groups

    def metrics(self) -> dict[str, float]:
        return {
            "rollout/sampling_rounds": float(self.rounds),
            "rollout/sampled_groups": float(self.sampled_groups),
            "rollout/informative_fraction_kept": self.informative_groups
            / max(self.sampled_groups, 1),
            "rollout/batch_filled": float(self.filled),
        }


def _take(tree, idx):
    return jax.tree.map(lambda x: np.asarray(x)[idx], tree)


def _concat(trees):
    return jax.tree.map(lambda *xs: np.concatenate(xs, axis=0), *trees)


def collect_informative_groups(
    sample_groups: Callable[[int], tuple[Any, Any]],
    num_groups: int,
    group_size: int,
    max_resample: int,
) -> tuple[Any, SamplingReport]:
    """Builds a batch of ``num_groups`` groups.

    ``sample_groups(round)`` returns ``(groups, rewards)``: ``groups`` a pytree whose leaves
    have a leading axis of G groups, ``rewards`` ``[G * group_size]`` (groups contiguous).
    Round 0 is the ordinary draw; rounds 1..max_resample are the resamples.
    """
    if num_groups < 1 or max_resample < 0:
        raise ValueError(f"need num_groups >= 1 and max_resample >= 0, got {num_groups}, {max_resample}")
    kept, kept_count, sampled = [], 0, 0
    spare = None  # latest uninformative groups, in case the batch stays short
    for rnd in range(max_resample + 1):
        groups, rewards = sample_groups(rnd)
        mask = np.asarray(informative_groups(np.asarray(rewards).reshape(-1), group_size))
        sampled += mask.size
        take = np.flatnonzero(mask)[: num_groups - kept_count]
        if take.size:
            kept.append(_take(groups, take))
            kept_count += take.size
        spare = (groups, np.flatnonzero(~mask))
        if kept_count == num_groups:
            break
    informative = kept_count
    if kept_count < num_groups:
        groups, idle = spare
        need = num_groups - kept_count
        if idle.size < need:
            raise ValueError(
                f"the sampler returned {idle.size + informative} usable groups; it must return at least {num_groups}"
            )
        kept.append(_take(groups, idle[:need]))
    report = SamplingReport(rnd + 1, sampled, informative, informative == num_groups)
    return _concat(kept), report
