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

Each side runs in a process of its own (``side_process``: this script again, with
``--side``), every process pinned to the same core (``--cpu N``, default the first the parent
may use; ``--no-pin`` leaves them unpinned). Each is warmed up once, then the parent asks
them in turn for one timed run each over ``--repeats`` rounds (load from other processes
hits all alike, and no two run at once); medians are reported. tokens/s = generated
model tokens (batch * turns * turn tokens) / seconds.

HF runs in two configurations, each a side of its own: ``hf``, ``generate`` called turn by
turn on the whole conversation, and ``hf_cache``, HF's own multi-turn recipe: the cache one
``generate`` call returns handed to the next, so each turn prefills only its new tokens.

The last line of stdout is one JSON object with each side's tokens/s and ``ratio`` = ours /
HF at its fastest of the two (``hf`` names it; ``ratios`` has both; higher is better for
us), plus ``ratio_reprefill`` = ours / re-prefill.

    python benchmarks/multiturn_rollout.py [--batch 16] [--turns 4] [--repeats 3]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pinning import pin_to_one_cpu  # noqa: E402  (no heavy imports: safe before the pinning)

CPU = None  # the core every side runs on (None: not pinned)
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

import numpy as np

# sampler_vs_hf pins torch to one thread when it is imported (before any torch work).
from sampler_vs_hf import MODEL, prompts  # noqa: E402
import roofline  # noqa: E402
from side_process import running_sides, serve, timed_in_turns  # noqa: E402

import jax  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

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




SIDES = ("hf", "hf_cache", "reprefill", "ours")
HF_SIDES = ("hf", "hf_cache")


def build_side(side: str, args) -> tuple:
    """``(run_once, ready info)`` of one side (in its own process), warmed up once; a JAX
    side also counts its FLOPs on that untimed run (every jitted call counted; no stop
    token: every turn's decode loop runs its N - 1 steps after the first token)."""
    B, T, N, O = args.batch, args.turns, args.turn_tokens, args.obs_tokens
    hf = tiny_hf_model("qwen2", seed=0, scale=0.1, attn_implementation="sdpa", **MODEL)
    info = {"params": sum(p.numel() for p in hf.parameters())}
    ids, mask = prompts(B)
    prompt_lists = [row[m > 0].tolist() for row, m in zip(ids, mask)]
    obs = list(range(100, 100 + O))
    key = jax.random.key(0)

    def left_pad(convs):
        w = max(map(len, convs))
        out = np.zeros((B, w), np.int64)
        m = np.zeros((B, w), np.int64)
        for r, c in enumerate(convs):
            out[r, w - len(c):], m[r, w - len(c):] = c, 1
        return out, m

    if side == "hf":
        def run_once():
            convs = [list(p) for p in prompt_lists]
            for t in range(T):
                i, m = left_pad(convs)
                with torch.no_grad():
                    out = hf.generate(input_ids=torch.tensor(i), attention_mask=torch.tensor(m), do_sample=True,
                                      temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=N, min_new_tokens=N)
                new = out[:, i.shape[1]:].numpy()
                convs = [c + new[r].tolist() + (obs if t < T - 1 else []) for r, c in enumerate(convs)]
            return convs

        run_once()
        return run_once, info
    if side == "hf_cache":
        # HF's own multi-turn recipe: the cache one generate call returns is handed to the
        # next with the whole conversation, and generate prefills only what it lacks (the
        # last sampled token and the observation). Every row grows by the same N + O tokens
        # a turn, so the left padding stays where the cache has it.
        obs_ids = torch.tensor([obs] * B)

        def run_once():
            seq, m, cache = torch.tensor(ids), torch.tensor(mask), None
            for t in range(T):
                with torch.no_grad():
                    out = hf.generate(input_ids=seq, attention_mask=m, cache=cache, return_dict_in_generate=True,
                                      do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=N,
                                      min_new_tokens=N)
                seq, cache = out.sequences, out.cache
                m = torch.cat([m, torch.ones(B, N, dtype=m.dtype)], 1)
                if t < T - 1:
                    seq, m = torch.cat([seq, obs_ids], 1), torch.cat([m, torch.ones(B, O, dtype=m.dtype)], 1)
            return seq

        run_once()
        return run_once, info
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        model = from_pretrained(d)
    hf = None  # its weights are ours now
    sampler = Sampler(model)
    if side == "ours":
        limits = TurnLimits(T, N, O, T * N + (T - 1) * O)
        ours = MultiTurnRollout(sampler, IdTokenizer(), limits, stop_string="")
        rows = [{"prompt": " ".join(map(str, p))} for p in prompt_lists]
        obs_text = " ".join(map(str, obs))

        def run_once():
            envs = [FixedObservation(obs_text, T) for _ in range(B)]
            ep = ours.run(envs, rows, key, temperature=1.0)
            assert int(ep.loss_mask.sum()) == B * T * N
            return ep

        counted = roofline.counting_calls(multi_turn, {"_turn": N - 1, "_extend": 1})
    else:
        sampling = SamplingParams(max_new_tokens=N, temperature=1.0)

        def run_once():
            convs = [list(p) for p in prompt_lists]
            for t in range(T):
                i, m = left_pad(convs)
                out = np.asarray(sampler.generate(i, m, jax.random.fold_in(key, t), sampling).tokens)
                convs = [c + out[r].tolist() + (obs if t < T - 1 else []) for r, c in enumerate(convs)]
            return convs

        counted = roofline.counting_calls(single_turn, {"prefill_prompts": 1, "decode_tokens": N - 1})
    run_once()  # the compile
    with counted as count:
        run_once()
    info["flops"] = count["flops"]
    return run_once, info


def side_command(side: str, args) -> list[str]:
    """This script again, as the child running ``side`` on the parent's core."""
    cmd = [sys.executable, os.path.abspath(__file__), "--side", side, "--batch", str(args.batch), "--turns",
           str(args.turns), "--turn-tokens", str(args.turn_tokens), "--obs-tokens", str(args.obs_tokens)]
    return cmd + (["--cpu", str(CPU)] if CPU is not None else ["--no-pin"])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--turn-tokens", type=int, default=32)
    parser.add_argument("--obs-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpu", type=int, help="the core every side runs on (default: the first this process may use)")
    parser.add_argument("--no-pin", action="store_true", help="leave the processes unpinned")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # a child's side
    roofline.add_peak_argument(parser)
    args = parser.parse_args(argv)
    if args.side:
        serve(*build_side(args.side, args))
        return
    B, T, N, O = args.batch, args.turns, args.turn_tokens, args.obs_tokens
    # The peak first, alone on the core, before any side exists.
    peak = roofline.peak_flops_per_s(args.peak_gflops)
    with running_sides({side: side_command(side, args) for side in SIDES}) as (sides, infos):
        times = timed_in_turns(sides, args.repeats)
    n_params = infos["ours"]["params"]
    print(f"model: qwen2, {n_params / 1e6:.2f}M params; {B} episodes x {T} turns x {N} tokens, observations {O}")
    tokens = B * T * N
    med = {side: statistics.median(r["wall"] for r in runs) for side, runs in times.items()}
    tps = {side: tokens / med[side] for side in SIDES}
    for side, name in (("hf", "HF turn by turn"), ("hf_cache", "HF, cache kept"), ("reprefill", "re-prefill"),
                       ("ours", "ours")):
        runs = ", ".join(f"{r['wall']:.3f}s" for r in times[side])
        print(f"{name:16s} {tps[side]:,.0f} tok/s  (runs: {runs})")
    # HF turn by turn re-feeds the conversation as re-prefill does (the same FLOP count); HF
    # with its cache kept prefills only the new tokens, as ours does (ours's count).
    flops_of = {"ours": infos["ours"]["flops"], "reprefill": infos["reprefill"]["flops"], "hf": infos["reprefill"]["flops"],
                "hf_cache": infos["ours"]["flops"]}
    rates = {side: roofline.rate(flops_of[side], med[side], peak) for side in ("ours", "reprefill", "hf", "hf_cache")}
    for side, r in rates.items():
        print(roofline.line(f"{side} FLOP/s", r, peak))
    flops = {**roofline.result_keys(rates["ours"], peak)}
    for side in ("reprefill", "hf", "hf_cache"):
        flops.update({k: v for k, v in roofline.result_keys(rates[side], peak, side).items() if k.startswith(side)})
    headline = max(HF_SIDES, key=tps.get)  # the peer at its fastest
    print(json.dumps({
        "benchmark": "multiturn_rollout", "params": n_params, "batch": B, "turns": T, "turn_tokens": N,
        "obs_tokens": O, "threads": 1, "processes": "own",
        "pinning": (f"each side in a process of its own, all on core {CPU}, timed in turns" if CPU is not None
                    else "each side in a process of its own, unpinned"),
        "hf": headline, "peer": f"transformers {transformers.__version__}, torch {torch.__version__}: generate, "
        "sdpa attention, torch.no_grad, " + {"hf": "called turn by turn on the whole conversation",
                                              "hf_cache": "its cache handed from each turn's call to the next"}[headline],
        "hf_tokens_per_s": round(tps[headline], 1),
        "hf_tokens_per_s_by_configuration": {s: round(tps[s], 1) for s in HF_SIDES},
        "reprefill_tokens_per_s": round(tps["reprefill"], 1),
        "ours_tokens_per_s": round(tps["ours"], 1), "ratio_reprefill": round(tps["ours"] / tps["reprefill"], 3),
        "ratios": {s: round(tps["ours"] / tps[s], 3) for s in HF_SIDES},
        "ratio": round(tps["ours"] / tps[headline], 3), **flops,
    }))


if __name__ == "__main__":
    main()
