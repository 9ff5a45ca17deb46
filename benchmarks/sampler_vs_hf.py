#!/usr/bin/env python
"""LM sampling throughput: ``rlinf_jax.rollout.sampler`` vs. Hugging Face ``generate``.

Both sides run the same tiny random Qwen2 (hidden 256, 4 layers, 4 heads, 2 KV heads,
intermediate 512, vocabulary 2048, tied embeddings: ~2.9M parameters) on the same 32
left-padded prompts (lengths 8-24), generating 64 new tokens each with plain temperature-1
sampling (no top-k, no top-p, no stop token), on ONE CPU core for both: the process is
pinned to one core before torch or JAX start a thread (``--cpu N``, default the first core
it may use), with ``torch.set_num_threads(1)`` and, set before JAX is imported,
``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1``. The flags
alone do not make XLA single-threaded (its CPU runtime still runs independent ops on a
pool), so without the pinning (``--no-pin``) our side would use a second core that torch
does not; the JSON records which (``pinned``). HF runs as ``generate`` does by default:
eager, with its dynamic KV cache and sdpa attention (``peer`` in the JSON).

Each side is warmed up once (our compile; torch's first-call costs), then the two are
timed in turns over ``--repeats`` rounds (so load from other processes hits both alike);
the median is reported. tokens/s = batch * new tokens / seconds.
Greedy outputs of the two sides are also compared (``greedy_match``) as a sanity check
that both run the same model.

The last line of stdout is one JSON object: each side's tokens/s, the settings, and
``ratio`` = ours / HF (higher is better for us).

    python benchmarks/sampler_vs_hf.py [--batch 32] [--new-tokens 64] [--repeats 5] [--cpu N | --no-pin]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pinning import pin_to_one_cpu  # noqa: E402  (no heavy imports: safe before the pinning)

CPU = None  # the core both sides run on (None: not pinned)
if __name__ == "__main__" and "--no-pin" not in sys.argv[1:]:
    # Before torch and JAX start their thread pools: threads inherit the affinity.
    CPU = pin_to_one_cpu(sys.argv[1:])

# Must precede the first `import jax` anywhere in the process.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
).strip()

import argparse
import json
import statistics
import tempfile
import time

import numpy as np
import torch
import transformers

torch.set_num_threads(1)
torch.set_num_interop_threads(1)

import jax

from rlinf_jax.policies.lm import from_pretrained
from rlinf_jax.policies.lm.tiny import tiny_hf_model
from rlinf_jax.rollout.sampler import Sampler, SamplingParams

import roofline  # noqa: E402
from recorded import warn_regressions  # noqa: E402

MODEL = {
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "vocab_size": 2048,
    "tie_word_embeddings": True,
}


def prompts(batch: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(8, 25, batch)
    width = int(lengths.max())
    ids = np.zeros((batch, width), np.int64)
    mask = np.zeros((batch, width), np.int64)
    for row, n in enumerate(lengths):
        ids[row, width - n :] = rng.integers(1, MODEL["vocab_size"], n)
        mask[row, width - n :] = 1
    return ids, mask


def timed_alternating(fns, repeats: int) -> list[list[float]]:
    """Wall times of each function, run in turns (a, b, a, b, ...) so that load from other
    processes on a shared machine hits both sides alike. One untimed warm-up call each."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return times


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cpu", type=int, help="the core both sides run on (default: the first this process may use)")
    parser.add_argument("--no-pin", action="store_true", help="leave the process unpinned (unequal: XLA's pool "
                        "takes a second core)")
    roofline.add_peak_argument(parser)
    args = parser.parse_args(argv)

    # sdpa: transformers' default (and its fastest CPU) attention.
    hf = tiny_hf_model("qwen2", seed=0, scale=0.1, attn_implementation="sdpa", **MODEL)
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        model = from_pretrained(d)
    n_params = sum(p.numel() for p in hf.parameters())
    ids, mask = prompts(args.batch)
    t_ids, t_mask = torch.tensor(ids), torch.tensor(mask)
    sampler = Sampler(model)
    key = jax.random.key(0)
    sampling = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0)

    def hf_run(do_sample=True):
        with torch.no_grad():
            return hf.generate(
                # top_k=0 and top_p=1 explicitly: left unset, transformers 5 falls back to
                # top_k=50 (its warning that top_k=0 "may be ignored" is spurious: with these
                # values no logits processor runs, plain sampling as on our side).
                input_ids=t_ids, attention_mask=t_mask, do_sample=do_sample, temperature=1.0, top_k=0, top_p=1.0,
                max_new_tokens=args.new_tokens,
            )

    def ours_run(params=sampling):
        out = sampler.generate(ids, mask, key, params)
        return jax.block_until_ready(out)

    print(f"model: qwen2, {n_params / 1e6:.2f}M params; batch {args.batch} x {args.new_tokens} new tokens")
    print(f"jax {jax.__version__} devices {jax.devices()}; torch {torch.__version__} threads {torch.get_num_threads()}")
    greedy_ref = hf_run(do_sample=False)[:, ids.shape[1] :].numpy()
    greedy_ours = np.asarray(ours_run(SamplingParams(max_new_tokens=args.new_tokens, temperature=0)).tokens)
    greedy_match = float((greedy_ref == greedy_ours).mean())
    print(f"greedy tokens equal: {greedy_match:.3f}")

    tokens = args.batch * args.new_tokens
    hf_times, ours_times = timed_alternating([hf_run, ours_run], args.repeats)
    hf_tps = tokens / statistics.median(hf_times)
    ours_tps = tokens / statistics.median(ours_times)
    print(f"HF generate: {hf_tps:,.0f} tok/s  (runs: {', '.join(f'{t:.3f}s' for t in hf_times)})")
    print(f"ours:        {ours_tps:,.0f} tok/s  (runs: {', '.join(f'{t:.3f}s' for t in ours_times)})")
    result = {
        "benchmark": "sampler_vs_hf",
        "model": "qwen2",
        "params": n_params,
        "batch": args.batch,
        "new_tokens": args.new_tokens,
        "threads": 1,
        "pinned": CPU is not None,
        "pinning": f"both sides in one process on core {CPU}" if CPU is not None else "none",
        "peer": {"library": f"transformers {transformers.__version__}, torch {torch.__version__}",
                 "generate": "eager, its default dynamic KV cache, sdpa attention, torch.no_grad",
                 "torch_threads": torch.get_num_threads()},
        "precision": "float32",
        "greedy_match": greedy_match,
        "hf_tokens_per_s": round(hf_tps, 1),
        "ours_tokens_per_s": round(ours_tps, 1),
        "ratio": round(ours_tps / hf_tps, 3),
    }
    # One FLOP count for both sides (same model, same tokens): prefill, then the decode
    # loop's max_new_tokens - 1 steps (no stop token: every row runs to the end).
    peak = roofline.peak_flops_per_s(args.peak_gflops)
    flops = roofline.program_flops(lambda: sampler.generate(ids, mask, key, sampling), while_trips=args.new_tokens - 1)
    ours, theirs = (roofline.rate(flops, statistics.median(t), peak) for t in (ours_times, hf_times))
    print(roofline.line("ours FLOP/s", ours, peak))
    print(roofline.line("HF   FLOP/s (same FLOP count)", theirs, peak))
    result.update(roofline.result_keys(ours, peak))
    result.update({k: v for k, v in roofline.result_keys(theirs, peak, "hf").items() if k.startswith("hf")})
    warn_regressions("sampler_vs_hf", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
