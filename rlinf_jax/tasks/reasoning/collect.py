"""The rollout half of a reasoning iteration, on the host and the rollout mesh: prompts from
the loader, ``group_size`` sampled responses each, rewards from the checker processes, and
DAPO's dynamic sampling (more groups until the batch is full of informative ones).

Rollout keys are ``fold_in(iteration key, round)`` with one stream per sample row, so the
samples do not depend on where the rollout runs or how many rounds came before.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from rlinf_jax.data import PromptLoader
from rlinf_jax.rewards.split import SplitRewards
from rlinf_jax.rollout.dynamic_sampling import collect_informative_groups
from rlinf_jax.rollout.lm_io import PromptEncoder, decode_responses
from rlinf_jax.rollout.sampler import Sampler, SamplingParams, bucket_length
from rlinf_jax.sharding.mesh import fetch


@dataclass
class Collector:
    sampler: Sampler
    encoder: PromptEncoder
    tokenizer: Any
    reward_fn: SplitRewards
    loader: PromptLoader
    sampling: SamplingParams
    num_prompts: int
    group: int
    dynamic_sampling: bool = False
    max_resample: int = 0

    @property
    def samples(self) -> int:
        return self.num_prompts * self.group

    def round(self, key) -> dict:
        """One batch of prompts, ``group_size`` responses each, scored on the host."""
        b = next(self.loader)
        seqs = self.encoder.encode(b.prompts, b.ids)
        ids, mask = self.encoder.pad(seqs)
        ids, mask = np.repeat(ids, self.group, axis=0), np.repeat(mask, self.group, axis=0)
        t0 = time.perf_counter()
        out = self.sampler.generate(ids, mask, key, self.sampling, sample_ids=np.arange(self.samples, dtype=np.uint32),
                                    group=self.group)
        tokens, rmask, logp, lengths = (np.asarray(x) for x in fetch((out.tokens, out.mask, out.logprobs, out.lengths)))
        t1 = time.perf_counter()
        texts = decode_responses(self.tokenizer, tokens, rmask)
        answers = [a for a in b.answers for _ in range(self.group)]
        result = self.reward_fn(texts, answers, lengths)
        t2 = time.perf_counter()
        stopped = np.isin(tokens, np.asarray(self.sampling.stop_tokens)) & rmask
        return {
            "prompts": [s for s in seqs for _ in range(self.group)],
            "tokens": tokens,
            "response_mask": rmask.astype(np.float32),
            "sampler_logp": logp.astype(np.float32),
            "lengths": lengths,
            "rewards": result.rewards.astype(np.float32),
            "correct": result.correct,
            "stopped": stopped.any(axis=1),
            "reward_metrics": result.metrics,
            "time": (t1 - t0, t2 - t1),
        }

    def batch(self, key) -> tuple[dict, dict]:
        """The iteration's rollout batch (host arrays) and its metrics."""
        rounds: list[dict] = []

        def sample_groups(rnd):
            data = self.round(jax.random.fold_in(key, rnd))
            rounds.append(data)
            ref = np.stack([np.full(self.num_prompts, rnd), np.arange(self.num_prompts)], axis=1)
            return {"ref": ref}, data["rewards"]

        extra = {}
        if self.dynamic_sampling:
            kept, report = collect_informative_groups(sample_groups, self.num_prompts, self.group, self.max_resample)
            rows = np.concatenate([np.arange(g * self.group, (g + 1) * self.group) for _, g in kept["ref"]])
            src = np.repeat(kept["ref"][:, 0], self.group)
            extra = report.metrics()
        else:
            sample_groups(0)
            rows, src = np.arange(self.samples), np.zeros(self.samples, np.int64)

        def pick(name):
            return np.stack([rounds[r][name][i] for r, i in zip(src, rows)])

        prompts = [rounds[r]["prompts"][i] for r, i in zip(src, rows)]
        prompt_ids, prompt_mask = self.encoder.pad(prompts)
        batch = {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            **{k: pick(k) for k in ("tokens", "response_mask", "sampler_logp", "rewards")},
        }
        # The update runs on the columns some response reaches (rounded up to a bucket, so
        # it compiles for a few widths only), not on all max_new_tokens.
        width = min(bucket_length(int(batch["response_mask"].sum(axis=1).max()), 16), batch["tokens"].shape[1])
        for k in ("tokens", "response_mask", "sampler_logp"):
            batch[k] = batch[k][:, :width]
        return batch, {**self.metrics(rounds), **extra}

    def metrics(self, rounds: list[dict]) -> dict:
        first = rounds[0]  # what the current policy does, before any filtering
        N = self.sampling.max_new_tokens
        rollout_sec = sum(r["time"][0] for r in rounds)
        return {
            **first["reward_metrics"],
            "rollout/reward_mean": float(first["rewards"].mean()),
            "rollout/accuracy": float(first["correct"].mean()),
            "rollout/response_length": float(first["lengths"].mean()),
            "rollout/response_length_max": float(first["lengths"].max()),
            "rollout/clip_rate": float((first["lengths"] >= N).mean()),
            "rollout/truncation_rate": float((~first["stopped"]).mean()),
            "time/rollout_sec": float(rollout_sec),
            "time/reward_sec": float(sum(r["time"][1] for r in rounds)),
            "rollout/tokens_per_sec": float(sum(r["lengths"].sum() for r in rounds) / max(rollout_sec, 1e-9)),
        }
