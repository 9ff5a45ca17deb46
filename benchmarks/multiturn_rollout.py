#!/usr/bin/env python
"""Multi-turn rollout throughput: ``rlinf_jax.rollout.multi_turn`` (one KV cache kept across
turns, only new tokens prefilled) against the same episodes generated turn by turn with the
whole conversation re-fed each turn, once through our single-turn sampler ("re-prefill")
and once through Hugging Face ``generate``.

Episodes: ``--batch`` prompts (lengths 8-24), ``--turns`` model turns of ``--turn-tokens``
sampled tokens each (temperature 1, no stop), each turn but the last followed by an
observation of ``--obs-tokens`` fixed tokens (a scripted environment, so the three sides do
the same work whatever they sample). The model is the tiny random Qwen2 of
``sampler_vs_hf.py`` (~2.9M parameters), on ONE CPU thread per side.

Each side is warmed up once, then the sides are timed in turns over ``--repeats`` rounds
(load from other processes hits all alike); medians are reported. tokens/s = generated
model tokens (batch * turns * turn tokens) / seconds.

The last line of stdout is one JSON object with each side's tokens/s and ``ratio`` = ours /
HF turn-by-turn (higher is better for us), plus ``ratio_reprefill`` = ours / re-prefill.

    python benchmarks/multiturn_rollout.py [--batch 16] [--turns 4] [--repeats 3]
"""

from __future__ import annotations

import os

# Must precede the first `import jax` anywhere in the process.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
).strip()

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# sampler_vs_hf pins torch to one thread when it is imported (before any torch work).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from sampler_vs_hf import MODEL, prompts  # noqa: E402
import roofline  # noqa: E402

import jax  # noqa: E402
import torch  # noqa: E402

from rlinf_jax.agents import StepResult  # noqa: E402
from rlinf_jax.policies.lm import from_pretrained  # noqa: E402
from rlinf_jax.policies.lm.tiny import tiny_hf_model  # noqa: E402
from rlinf_jax.rollout import multi_turn  # noqa: E402
from rlinf_jax.rollout import sampler as single_turn  # noqa: E402
from rlinf_jax.rollout.multi_turn import MultiTurnRollout, TurnLimits  # noqa: E402
from rlinf_jax.rollout.sampler import Sampler, SamplingParams  # noqa: E402


class IdTokenizer:
    """Text is space-separated token ids; there is no end token (-5 never matches)."""

    eos_token_id = -5

    def encode(self, text, add_special_tokens=False):
        return [int(t) for t in text.split()]

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


class FixedObservation:
    def __init__(self, obs, turns):
        self.obs, self.max_turns = obs, turns

    def reset(self, row):
        self.turn = 0
        return row["prompt"]

    def step(self, text):
        self.turn += 1
        done = self.turn >= self.max_turns
        return StepResult("" if done else self.obs, 0.0, done, {})



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
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--turn-tokens", type=int, default=32)
    parser.add_argument("--obs-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    roofline.add_peak_argument(parser)
    args = parser.parse_args(argv)
    B, T, N, O = args.batch, args.turns, args.turn_tokens, args.obs_tokens

    hf = tiny_hf_model("qwen2", seed=0, scale=0.1, attn_implementation="sdpa", **MODEL)
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        model = from_pretrained(d)
    ids, mask = prompts(B)
    prompt_lists = [row[m > 0].tolist() for row, m in zip(ids, mask)]
    obs = list(range(100, 100 + O))
    obs_text = " ".join(map(str, obs))
    sampler = Sampler(model)
    key = jax.random.key(0)
    limits = TurnLimits(T, N, O, T * N + (T - 1) * O)
    ours = MultiTurnRollout(sampler, IdTokenizer(), limits, stop_string="")
    rows = [{"prompt": " ".join(map(str, p))} for p in prompt_lists]

    def ours_run():
        envs = [FixedObservation(obs_text, T) for _ in range(B)]
        ep = ours.run(envs, rows, key, temperature=1.0)
        assert int(ep.loss_mask.sum()) == B * T * N
        return ep

    def left_pad(convs):
        w = max(map(len, convs))
        out = np.zeros((B, w), np.int64)
        m = np.zeros((B, w), np.int64)
        for r, c in enumerate(convs):
            out[r, w - len(c):], m[r, w - len(c):] = c, 1
        return out, m

    sampling = SamplingParams(max_new_tokens=N, temperature=1.0)

    def reprefill_run():
        convs = [list(p) for p in prompt_lists]
        for t in range(T):
            i, m = left_pad(convs)
            out = np.asarray(sampler.generate(i, m, jax.random.fold_in(key, t), sampling).tokens)
            convs = [c + out[r].tolist() + (obs if t < T - 1 else []) for r, c in enumerate(convs)]
        return convs

    def hf_run():
        convs = [list(p) for p in prompt_lists]
        for t in range(T):
            i, m = left_pad(convs)
            with torch.no_grad():
                out = hf.generate(input_ids=torch.tensor(i), attention_mask=torch.tensor(m), do_sample=True,
                                  temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=N, min_new_tokens=N)
            new = out[:, i.shape[1]:].numpy()
            convs = [c + new[r].tolist() + (obs if t < T - 1 else []) for r, c in enumerate(convs)]
        return convs

    n_params = sum(p.numel() for p in hf.parameters())
    print(f"model: qwen2, {n_params / 1e6:.2f}M params; {B} episodes x {T} turns x {N} tokens, observations {O}")
    hf_t, rp_t, ours_t = timed_alternating([hf_run, reprefill_run, ours_run], args.repeats)
    tokens = B * T * N
    hf_tps, rp_tps, ours_tps = (tokens / statistics.median(x) for x in (hf_t, rp_t, ours_t))
    for name, tps, times in (("HF turn by turn", hf_tps, hf_t), ("re-prefill", rp_tps, rp_t), ("ours", ours_tps, ours_t)):
        print(f"{name:16s} {tps:,.0f} tok/s  (runs: {', '.join(f'{t:.3f}s' for t in times)})")
    # FLOPs of one untimed run of each JAX side, every jitted call counted (no stop token:
    # every turn's decode loop runs its N - 1 steps after the first token). HF re-feeds the
    # conversation as re-prefill does: the same FLOP count.
    with roofline.counting_calls(multi_turn, {"_turn": N - 1, "_extend": 1}) as ours_count:
        ours_run()
    with roofline.counting_calls(single_turn, {"prefill_prompts": 1, "decode_tokens": N - 1}) as rp_count:
        reprefill_run()
    peak = roofline.peak_flops_per_s(args.peak_gflops)
    rates = {side: roofline.rate(c["flops"], statistics.median(t), peak)
             for side, c, t in (("ours", ours_count, ours_t), ("reprefill", rp_count, rp_t), ("hf", rp_count, hf_t))}
    for side, r in rates.items():
        print(roofline.line(f"{side} FLOP/s", r, peak))
    flops = {**roofline.result_keys(rates["ours"], peak)}
    for side in ("reprefill", "hf"):
        flops.update({k: v for k, v in roofline.result_keys(rates[side], peak, side).items() if k.startswith(side)})
    print(json.dumps({
        "benchmark": "multiturn_rollout", "params": n_params, "batch": B, "turns": T, "turn_tokens": N,
        "obs_tokens": O, "threads": 1, "hf_tokens_per_s": round(hf_tps, 1), "reprefill_tokens_per_s": round(rp_tps, 1),
        "ours_tokens_per_s": round(ours_tps, 1), "ratio_reprefill": round(ours_tps / rp_tps, 3),
        "ratio": round(ours_tps / hf_tps, 3), **flops,
    }))


if __name__ == "__main__":
    main()
