#!/usr/bin/env python
"""LM sampling throughput: ``rlinf_jax.rollout.sampler`` vs. Hugging Face ``generate``.

Both sides run the same random Qwen2 on the same 32 left-padded prompts (lengths 8-24),
generating 64 new tokens each with plain temperature-1 sampling (no top-k, no top-p, no
stop token). ``--size`` picks the model, built locally for both sides (no hub):

* ``tiny`` (default): hidden 256, 4 layers, 4 heads, 2 KV heads, intermediate 512,
  vocabulary 2048, tied embeddings: ~2.9M parameters, where Python's cost per token
  dominates;
* ``0.5b``: Qwen2.5-0.5B's shapes (hidden 896, 24 layers, 14 heads, 2 KV heads,
  intermediate 4864, vocabulary 151,936, tied embeddings: 494M parameters), random
  weights: the size people train.

Each side runs in a process of its own (``side_process``: this script again, with
``--side``), and all on ONE CPU core: each process is pinned to the same core before torch
or JAX start a thread (``--cpu N``, default the first core the parent may use), with
``torch.set_num_threads(1)`` and, set before JAX is imported,
``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1``. The flags
alone do not make XLA single-threaded (its CPU runtime still runs independent ops on a
pool), so without the pinning (``--no-pin``) our side would use a second core that torch
does not; the JSON records which (``pinned``). HF runs with sdpa attention in each of the
configurations ``--hf`` names (all three by default), each in a process of its own and
timed in the same rounds:

* ``eager``: ``generate``'s defaults, eager with its dynamic KV cache;
* ``static``: ``cache_implementation="static"`` (a preallocated cache), eager;
* ``compiled``: the static cache with ``generate``'s own compilation of the decode step
  (``CompileConfig(fullgraph=True, dynamic=False, mode="default")``, torch.compile's
  inductor; HF compiles automatically only on accelerators, so the config asks for it on
  the CPU), HF's documented recipe for fast decoding.

``ratio`` is ours / the fastest of the configurations timed (``hf`` names it; at 2.9M
parameters the compiled decode is the slowest of the three, at 0.5B the fastest);
``ratios`` holds one per configuration.

Each side is built and warmed up once in its process (our compile; torch's first-call
costs), then the parent asks the processes in turn for one timed call each, over
``--repeats`` rounds (so load from other processes hits every side alike, and no two run
at once); the median is reported. tokens/s = batch * new tokens / seconds.
``--matmul mkl`` routes every matrix product of our sampler (projections, MLP, tied head)
through Intel MKL (``actor.model.matmul=mkl``, the ``mkl`` extra; one MKL thread), the
library torch's own CPU products call; ``xla`` (default) is XLA's dot.

Greedy outputs of the two sides are also compared (``greedy_match``) as a sanity check
that both run the same model.

The last line of stdout is one JSON object: each side's tokens/s, the settings, and
``ratio`` = ours / HF (higher is better for us).

    python benchmarks/sampler_vs_hf.py [--batch 32] [--new-tokens 64] [--repeats 5] [--cpu N | --no-pin]
    python benchmarks/sampler_vs_hf.py --size 0.5b --new-tokens 32 --repeats 3
    python benchmarks/sampler_vs_hf.py --hf eager          # generate's defaults alone
    python benchmarks/sampler_vs_hf.py --size 0.5b --matmul mkl
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

# --matmul mkl: one thread, as torch's (read when MKL loads).
os.environ.setdefault("MKL_NUM_THREADS", "1")

# Must precede the first `import jax` anywhere in the process.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
).strip()

import argparse
import json
import statistics
import tempfile

import numpy as np
import torch
import transformers

torch.set_num_threads(1)
torch.set_num_interop_threads(1)

import jax

from rlinf_jax import kernels
from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm import from_pretrained, set_matmul
from rlinf_jax.policies.lm.tiny import tiny_hf_model
from rlinf_jax.rollout.sampler import Sampler, SamplingParams

import roofline  # noqa: E402
from recorded import warn_regressions  # noqa: E402
from side_process import running_sides, serve, timed_in_turns  # noqa: E402
from lm_sizes import SCALES, SIZES  # noqa: E402

MODEL = SIZES["tiny"]  # the tiny model, as multiturn_rollout.py and dot_gap.py build it

HF_MODES = ("eager", "static", "compiled")


def hf_generate_kwargs(mode: str) -> dict:
    """``generate``'s keyword arguments for HF configuration ``mode`` (module docstring)."""
    if mode == "eager":
        return {}
    if mode == "static":
        return {"cache_implementation": "static", "disable_compile": True}
    compile_config = transformers.CompileConfig(fullgraph=True, dynamic=False, mode="default")
    compile_config._compile_all_devices = True  # HF's switch for compiling on the CPU
    return {"cache_implementation": "static", "compile_config": compile_config}


def prompts(batch: int, vocab_size: int = MODEL["vocab_size"], seed: int = 0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(8, 25, batch)
    width = int(lengths.max())
    ids = np.zeros((batch, width), np.int64)
    mask = np.zeros((batch, width), np.int64)
    for row, n in enumerate(lengths):
        ids[row, width - n :] = rng.integers(1, vocab_size, n)
        mask[row, width - n :] = 1
    return ids, mask


def build_side(side: str, args) -> tuple:
    """``(run_once, ready info)`` of one side (in its own process): the model built and
    loaded, one untimed warm-up call made (our compile; torch's first-call costs)."""
    shapes = SIZES[args.size]
    # sdpa: transformers' default (and its fastest CPU) attention.
    hf = tiny_hf_model("qwen2", seed=0, scale=SCALES[args.size], attn_implementation="sdpa", **shapes)
    n_params = sum(p.numel() for p in hf.parameters())
    ids, mask = prompts(args.batch, shapes["vocab_size"])
    info = {"params": n_params, "threads": torch.get_num_threads() if side != "ours" else 1}
    if side == "ours":
        with tempfile.TemporaryDirectory() as d:
            hf.save_pretrained(d)
            model = from_pretrained(d)
        del hf  # its weights are ours now
        # FLOPs are counted on the jaxpr's dots, which a custom call hides: count them with
        # XLA's products first (the arithmetic is the same).
        flops = roofline.program_flops(lambda: Sampler(model).generate(ids, mask, jax.random.key(0), SamplingParams(
            max_new_tokens=args.new_tokens, temperature=1.0)), while_trips=args.new_tokens - 1)
        set_matmul(model, args.matmul)
        sampler, key = Sampler(model), jax.random.key(0)
        sampling = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0)

        def run_once(params=sampling):
            return jax.block_until_ready(sampler.generate(ids, mask, key, params))

        greedy = run_once(SamplingParams(max_new_tokens=args.new_tokens, temperature=0)).tokens
        info["greedy"] = np.asarray(greedy).tolist()
        # prefill, then the decode loop's max_new_tokens - 1 steps (no stop token: every
        # row runs to the end); one count for both sides (same model, same tokens)
        info["flops"] = flops
        info["versions"] = f"jax {jax.__version__} devices {jax.devices()}"
    else:
        t_ids, t_mask = torch.tensor(ids), torch.tensor(mask)

        def run_once(do_sample=True):
            with torch.no_grad():
                return hf.generate(
                    # top_k=0 and top_p=1 explicitly: left unset, transformers 5 falls back
                    # to top_k=50 (its warning that top_k=0 "may be ignored" is spurious:
                    # with these values no logits processor runs, plain sampling as ours).
                    input_ids=t_ids, attention_mask=t_mask, do_sample=do_sample, temperature=1.0, top_k=0,
                    top_p=1.0, max_new_tokens=args.new_tokens, **hf_generate_kwargs(side),
                )

        if args.greedy:
            info["greedy"] = run_once(do_sample=False)[:, ids.shape[1]:].numpy().tolist()
        info["versions"] = f"transformers {transformers.__version__}, torch {torch.__version__}"
    run_once()
    if side == "compiled":  # that torch.compile did run: the graphs dynamo captured
        info["compiled_graphs"] = int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    return run_once, info


def side_command(side: str, args, greedy: bool) -> list[str]:
    """This script again, as the child running ``side`` on the parent's core."""
    cmd = [sys.executable, os.path.abspath(__file__), "--side", side, "--size", args.size, "--batch", str(args.batch),
           "--new-tokens", str(args.new_tokens), "--matmul", args.matmul]
    cmd += ["--cpu", str(CPU)] if CPU is not None else ["--no-pin"]
    return cmd + (["--greedy"] if greedy else [])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cpu", type=int, help="the core every side runs on (default: the first this process may use)")
    parser.add_argument("--no-pin", action="store_true", help="leave the processes unpinned (unequal: XLA's pool "
                        "takes a second core)")
    parser.add_argument("--size", choices=tuple(SIZES), default="tiny", help="the model's shapes (module docstring)")
    parser.add_argument("--hf", nargs="+", choices=HF_MODES, default=list(HF_MODES),
                        help="HF configurations to time (module docstring); the ratio is against the fastest")
    parser.add_argument("--matmul", choices=kernels.BACKENDS, default="xla",
                        help="our products' backend (actor.model.matmul): XLA's dot or Intel MKL")
    parser.add_argument("--side", choices=("ours", *HF_MODES), help=argparse.SUPPRESS)  # a child's side
    parser.add_argument("--greedy", action="store_true", help=argparse.SUPPRESS)  # a child reports greedy tokens
    roofline.add_peak_argument(parser)
    args = parser.parse_args(argv)
    try:  # before any side starts: MKL's kernel is built here when it is not yet cached
        kernels.check_backend(args.matmul, "float32")
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.side:
        serve(*build_side(args.side, args))
        return
    args.hf = list(dict.fromkeys(args.hf))  # each configuration once
    # The peak first, alone on the core, before any side exists.
    peak = roofline.peak_flops_per_s(args.peak_gflops)
    commands = {"ours": side_command("ours", args, False)}
    commands.update({mode: side_command(mode, args, i == 0) for i, mode in enumerate(args.hf)})
    with running_sides(commands) as (sides, infos):
        times = timed_in_turns(sides, args.repeats)
    n_params = infos["ours"]["params"]
    print(f"model: qwen2 ({args.size}), {n_params / 1e6:.2f}M params; batch {args.batch} x {args.new_tokens} new tokens")
    print(f"ours: {infos['ours']['versions']}; HF: {infos[args.hf[0]]['versions']}, threads {infos[args.hf[0]]['threads']}")
    greedy_match = float((np.asarray(infos[args.hf[0]]["greedy"]) == np.asarray(infos["ours"]["greedy"])).mean())
    print(f"greedy tokens equal: {greedy_match:.3f}")

    tokens = args.batch * args.new_tokens
    med = {name: statistics.median(r["wall"] for r in runs) for name, runs in times.items()}
    hf_tps = {mode: tokens / med[mode] for mode in args.hf}
    ours_tps = tokens / med["ours"]
    for mode in args.hf:
        runs = ", ".join(f"{r['wall']:.3f}s" for r in times[mode])
        print(f"HF generate, {mode:<8}: {hf_tps[mode]:,.0f} tok/s  (runs: {runs})")
    ours_runs = ", ".join(f"{r['wall']:.3f}s" for r in times["ours"])
    print(f"ours:                 {ours_tps:,.0f} tok/s  (runs: {ours_runs})")
    headline = max(hf_tps, key=hf_tps.get)  # the peer at its fastest
    result = {
        "benchmark": "sampler_vs_hf",
        "model": "qwen2",
        "size": args.size,
        "params": n_params,
        "batch": args.batch,
        "new_tokens": args.new_tokens,
        "threads": 1,
        "pinned": CPU is not None,
        "processes": "own",
        "pinning": (f"each side in a process of its own, all on core {CPU}, timed in turns" if CPU is not None
                    else "each side in a process of its own, unpinned"),
        "hf": headline,
        "peer": {"library": infos[headline]["versions"],
                 "generate": {"eager": "eager, its default dynamic KV cache",
                              "static": "eager, cache_implementation='static'",
                              "compiled": "cache_implementation='static', its decode step compiled by generate "
                                          "(torch.compile inductor, fullgraph, dynamic=False)"}[headline]
                 + ", sdpa attention, torch.no_grad",
                 "torch_threads": infos[headline]["threads"]},
        "precision": "float32",
        "matmul": args.matmul,
        "greedy_match": greedy_match,
        "hf_tokens_per_s": round(hf_tps[headline], 1),
        "hf_tokens_per_s_by_configuration": {m: round(v, 1) for m, v in hf_tps.items()},
        "ours_tokens_per_s": round(ours_tps, 1),
        "ratios": {m: round(ours_tps / v, 3) for m, v in hf_tps.items()},
        "ratio": round(ours_tps / hf_tps[headline], 3),
    }
    if "compiled" in args.hf:
        result["hf_compiled_graphs"] = infos["compiled"]["compiled_graphs"]
    flops = infos["ours"]["flops"]
    ours, theirs = (roofline.rate(flops, med[name], peak) for name in ("ours", headline))
    print(roofline.line("ours FLOP/s", ours, peak))
    print(roofline.line(f"HF {headline} FLOP/s (same FLOP count)", theirs, peak))
    result.update(roofline.result_keys(ours, peak))
    result.update({k: v for k, v in roofline.result_keys(theirs, peak, "hf").items() if k.startswith("hf")})
    warn_regressions("sampler_vs_hf", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
