#!/usr/bin/env python
"""How much of the LM train step's gap to torch's bfloat16 step a custom matmul would close.

The performance issue asks, before anyone writes a ``jax.ffi`` custom call into oneDNN (the
library torch's bfloat16 matrix products run through, on the CPU's AMX tiles where it has
them), which share of the gap such a call would close. This script measures it on
``train_step_vs_torch.py``'s step (same model, batch and AdamW), all on ONE core:

1. every ``dot_general`` of our jitted float32 train step's jaxpr, with how often it runs;
2. each distinct product alone, same shapes: XLA float32, XLA bfloat16, torch float32 and
   torch bfloat16 (oneDNN), medians of ``--repeats`` timings of ``--calls`` calls (torch: the
   fastest of ``torch.einsum``, a batched product of permuted views and one of contiguous
   copies of them, copies counted: in bfloat16 the first two run a product that contracts
   the 4096 token rows 5-20x slower than in float32);
3. the whole step: ours in float32 and in bfloat16 compute, torch in float32 and under
   bfloat16 autocast (``train_step_vs_torch``'s trainers, timed in turns).

The estimate: our float32 step with its products swapped for torch's, each the faster of
torch's float32 and bfloat16 product of that shape (bfloat16 is 5-10x faster where the
token rows are the free axis and slower where they are contracted), i.e.
``step_f32 - sum(XLA float32 products) + sum(torch's best products)``: a custom call that
runs each product as oneDNN does and leaves everything else to XLA (no conversion cost
counted, so the estimate is optimistic). Products timed alone miss what XLA fuses into
them, so ``dots_share`` (their sum over the step) is an estimate too.

The last line of stdout is one JSON object with every figure, the estimated step, and
``estimated_ratio`` = torch bfloat16 step / estimated step (>= 1: the custom call would
put us level with or ahead of torch's bfloat16 step).

    python benchmarks/dot_gap.py [--batch 32] [--seq 128] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

if __name__ == "__main__":
    # One core for both sides, before torch or JAX start their thread pools.
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# Sets the one-thread XLA flags and torch threads before JAX starts (through sampler_vs_hf).
import train_step_vs_torch as ts  # noqa: E402  isort: skip
from roofline import collect_dots, dot_flops as flops, einsum_spec  # noqa: E402  isort: skip

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from flax import nnx  # noqa: E402

from rlinf_jax.policies.lm import from_pretrained  # noqa: E402
from rlinf_jax.policies.lm.tiny import tiny_hf_model  # noqa: E402



def timed_turns(fns, steps: int, repeats: int):
    """Seconds per step of each function, wall clock and process CPU time, over ``repeats``
    turns of ``steps`` calls, the functions taking turns (a, b, a, b, ...) so that load from
    other processes hits all alike. One untimed warm-up turn each."""

    def turn(fn):
        for _ in range(steps):
            out = fn()
        float(out)  # wait for the last step (jax dispatches asynchronously)

    for fn in fns:
        turn(fn)
    wall, cpu = [[] for _ in fns], [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            w, c = time.perf_counter(), time.process_time()
            turn(fn)
            wall[i].append((time.perf_counter() - w) / steps)
            cpu[i].append((time.process_time() - c) / steps)
    return wall, cpu

def _median_time(call, calls: int, repeats: int) -> float:
    warm = call()  # compiles; waited for, so that no timing includes it
    if isinstance(warm, jax.Array):
        warm.block_until_ready()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            out = call()
        if isinstance(out, jax.Array):
            out.block_until_ready()
        times.append((time.perf_counter() - t) / calls)
    return statistics.median(times)


def time_dot(key, calls: int, repeats: int) -> dict:
    """Seconds per product of one shape: XLA and torch, float32 and bfloat16."""
    lhs, rhs, (lc, rc), (lb, rb) = key
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(lhs, np.float32), rng.standard_normal(rhs, np.float32)
    dims = ((lc, rc), (lb, rb))
    out = {}
    for dtype in ("float32", "bfloat16"):
        x, y = jnp.asarray(a, dtype), jnp.asarray(b, dtype)
        f = jax.jit(lambda u, v: jax.lax.dot_general(u, v, dims))
        out[f"xla_{dtype}"] = _median_time(lambda: f(x, y), calls, repeats)
    spec = einsum_spec(key)
    lfree = [i for i in range(len(lhs)) if i not in lc and i not in lb]
    rfree = [j for j in range(len(rhs)) if j not in rc and j not in rb]

    def as_bmm(x, y, copy=False):
        # [batch, M, K] @ [batch, K, N] over permuted views (strided, no einsum planning),
        # or over contiguous copies of them (the copies counted).
        xb = x.permute(*lb, *lfree, *lc).reshape(-1, math.prod(lhs[i] for i in lfree), math.prod(lhs[i] for i in lc))
        yb = y.permute(*rb, *rc, *rfree).reshape(-1, math.prod(rhs[j] for j in rc), math.prod(rhs[j] for j in rfree))
        if copy:
            xb, yb = xb.contiguous(), yb.contiguous()
        return torch.matmul(xb, yb)

    for dtype, tdtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        x, y = torch.from_numpy(a).to(tdtype), torch.from_numpy(b).to(tdtype)
        with torch.no_grad():
            # The faster of two ways into the same library: what a custom call could reach.
            out[f"torch_{dtype}"] = min(_median_time(lambda: torch.einsum(spec, x, y), calls, repeats),
                                        _median_time(lambda: as_bmm(x, y), calls, repeats),
                                        _median_time(lambda: as_bmm(x, y, copy=True), calls, repeats))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--calls", type=int, default=5, help="products per timing")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=2, help="train steps per timed turn")
    args = p.parse_args(argv)

    hf = tiny_hf_model("qwen2", seed=0, scale=0.1, attn_implementation="sdpa", **ts.MODEL)
    ids = ts.token_batch(args.batch, args.seq)
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        models = {dt: from_pretrained(d, dtype=dt, param_dtype="float32") for dt in ("float32", "bfloat16")}

    # 1. The products of our float32 step.
    graphdef, params = nnx.split(models["float32"])
    batch = jnp.asarray(ids, jnp.int32)
    loss_grad = jax.value_and_grad(lambda p: ts.causal_lm_loss(nnx.merge(graphdef, p), batch))
    dots = collect_dots(jax.make_jaxpr(loss_grad)(params).jaxpr)
    print(f"{sum(dots.values())} products of {len(dots)} shapes in the step's forward and backward", flush=True)

    # 2. Each product alone.
    per = {}
    for key, count in sorted(dots.items(), key=lambda kv: -flops(kv[0]) * kv[1]):
        per[key] = time_dot(key, args.calls, args.repeats)
        t = per[key]
        print(f"{count:3d} x {str(key[0]):>18s} . {str(key[1]):<18s} {flops(key) / 1e6:8.1f} MFLOP   "
              f"xla f32 {t['xla_float32'] * 1e3:6.2f} ms  xla bf16 {t['xla_bfloat16'] * 1e3:6.2f}  "
              f"torch f32 {t['torch_float32'] * 1e3:6.2f}  torch bf16 {t['torch_bfloat16'] * 1e3:6.2f}", flush=True)
    for t in per.values():
        # A custom call would pick, product by product, the faster of oneDNN's two paths.
        t["torch_best"] = min(t["torch_float32"], t["torch_bfloat16"])
    sums = {k: sum(per[key][k] * n for key, n in dots.items()) for k in next(iter(per.values()))}
    total_flops = sum(flops(key) * n for key, n in dots.items())

    # 3. The whole steps, in turns.
    trainers = {
        "ours_float32": ts.jax_trainer(models["float32"], ids),
        "ours_bfloat16": ts.jax_trainer(models["bfloat16"], ids),
        "torch_float32": ts.torch_trainer(hf, ids, "float32"),
    }
    hf_bf16 = tiny_hf_model("qwen2", seed=0, scale=0.1, attn_implementation="sdpa", **ts.MODEL)
    trainers["torch_bfloat16"] = ts.torch_trainer(hf_bf16, ids, "bfloat16")
    wall, cpu = timed_turns(list(trainers.values()), args.steps, args.repeats)
    steps = {name: statistics.median(c) for name, c in zip(trainers, cpu)}
    for name, s in steps.items():
        print(f"step {name:15s} {s * 1e3:7.1f} ms (CPU time)")

    estimated = steps["ours_float32"] - sums["xla_float32"] + sums["torch_best"]
    out = {
        "benchmark": "dot_gap", "batch": args.batch, "seq": args.seq, "threads": 1,
        "products": sum(dots.values()), "shapes": len(dots), "product_gflop": round(total_flops / 1e9, 2),
        **{f"products_{k}_s": round(v, 5) for k, v in sums.items()},
        **{f"products_{k}_gflops": round(total_flops / v / 1e9, 1) for k, v in sums.items()},
        **{f"step_{k}_s": round(v, 5) for k, v in steps.items()},
        "dots_share": round(sums["xla_float32"] / steps["ours_float32"], 3),
        "estimated_step_s": round(estimated, 5),
        "gap_closed": round((steps["ours_float32"] - estimated)
                            / max(steps["ours_float32"] - steps["torch_bfloat16"], 1e-9), 3),
        "estimated_ratio": round(steps["torch_bfloat16"] / estimated, 3),
    }
    print(f"products: {total_flops / 1e9:.1f} GFLOP a step; XLA f32 {sums['xla_float32'] * 1e3:.0f} ms "
          f"({out['dots_share']:.0%} of our f32 step), torch bf16 {sums['torch_bfloat16'] * 1e3:.0f} ms, "
          f"torch's faster of f32 and bf16 per product {sums['torch_best'] * 1e3:.0f} ms")
    print(f"estimate: our step with oneDNN's products {estimated * 1e3:.0f} ms against torch's bf16 step "
          f"{steps['torch_bfloat16'] * 1e3:.0f} ms: ratio {out['estimated_ratio']:.2f}, "
          f"{out['gap_closed']:.0%} of the gap closed")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
