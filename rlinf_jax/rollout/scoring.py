"""Scoring a language model on a prompt dataset: accuracy, pass@1 and pass@k.

Each record is answered ``n`` times (greedy: once) by the run's sampler; the reward function's
``correct`` score says which answers are right. Sample ``j`` of record ``i`` draws from its own
random stream (sample id ``i * n + j``), so the numbers do not depend on the batch size.
Batches keep one shape (a short last batch is padded with copies of its last prompt, whose
answers are dropped), so the sampler compiles once per prompt bucket.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from rlinf_jax.rollout.lm_io import PromptEncoder, decode_responses
from rlinf_jax.sharding.mesh import fetch


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al., 2021) from ``n`` samples of which ``c`` are correct:
    ``1 - C(n - c, k) / C(n, k)``."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def score_dataset(
    sampler,
    encoder: PromptEncoder,
    reward_fn,
    dataset,
    sampling,
    key,
    batch_size: int,
    n_samples: int = 1,
    ks: tuple[int, ...] = (1,),
    progress: Callable[[int], None] | None = None,
    keep_responses: bool = False,
) -> dict:
    """Answers every record of ``dataset`` ``n_samples`` times; returns metrics
    (``accuracy`` = mean correctness of all answers, ``pass@k`` for each k) and, with
    ``keep_responses``, the records with their responses and scores."""
    tokenizer = encoder.tokenizer
    rows = max(1, batch_size // n_samples) * n_samples  # whole records per generate call
    per_call = rows // n_samples
    correct = np.zeros((len(dataset), n_samples), np.float32)
    lengths = np.zeros((len(dataset), n_samples), np.float32)
    kept = []
    for start in range(0, len(dataset), per_call):
        idx = list(range(start, min(start + per_call, len(dataset))))
        records = [dataset[i] for i in idx]
        real = len(idx)
        idx += [idx[-1]] * (per_call - real)  # pad to one static batch shape
        records_padded = records + [records[-1]] * (per_call - real)
        ids, mask = encoder([r["prompt"] for r in records_padded], [r.get("id") for r in records_padded])
        ids, mask = np.repeat(ids, n_samples, axis=0), np.repeat(mask, n_samples, axis=0)
        sample_ids = (np.repeat(np.asarray(idx), n_samples) * n_samples + np.tile(np.arange(n_samples), per_call))
        out = sampler.generate(ids, mask, key, sampling, sample_ids=sample_ids.astype(np.uint32))
        # `fetch`: in a multi-host job the outputs may live on other hosts' devices.
        tokens, rmask, lens = (np.asarray(x) for x in fetch((out.tokens, out.mask, out.lengths)))
        texts = decode_responses(tokenizer, tokens[: real * n_samples], rmask[: real * n_samples])
        answers = [r["answer"] for r in records for _ in range(n_samples)]
        result = reward_fn(texts, answers, lens[: real * n_samples])
        correct[start : start + real] = np.asarray(result.correct).reshape(real, n_samples)
        lengths[start : start + real] = lens[: real * n_samples].reshape(real, n_samples)
        if keep_responses:
            for i, r in enumerate(records):
                kept.append({
                    "id": r.get("id"),
                    "prompt": r["prompt"],
                    "answer": r["answer"],
                    "responses": texts[i * n_samples : (i + 1) * n_samples],
                    "correct": correct[start + i].tolist(),
                })
        if progress is not None:
            progress(real)
    hits = (correct > 0.5).sum(axis=1)
    metrics = {"accuracy": float(correct.mean()), "response_length": float(lengths.mean())}
    levels = [dataset[i].get("level") for i in range(len(dataset))] if len(dataset) else []
    if levels and all(isinstance(v, int) for v in levels) and len(set(levels)) > 1:
        # Procedural data: accuracy per difficulty level, to see where a gain comes from.
        levels = np.asarray(levels)
        for level in sorted(set(levels.tolist())):
            metrics[f"accuracy_level{level}"] = float(correct[levels == level].mean())
    for k in ks:
        metrics[f"pass@{k}"] = float(np.mean([pass_at_k(n_samples, int(c), k) for c in hits]))
    if keep_responses:
        metrics["records"] = kept
    return metrics
