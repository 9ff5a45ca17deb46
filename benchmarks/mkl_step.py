#!/usr/bin/env python
"""LM training step with its matrix products through MKL (a ``jax.ffi`` custom call), beside
XLA's own products and torch's step.

``train_step_vs_torch.py``'s step, model and batch, on one core, three sides timed in turns:

- torch (``torch.autocast`` in bfloat16, or float32), as in ``train_step_vs_torch.py``;
- ours, as the library runs it (XLA's products);
- ours with every matrix product routed through Intel MKL: the dense layers, the tied
  output head and the attention's two batched products, forward and backward (hand-written
  VJPs, weight gradients included), built from ``benchmarks/mkl_ffi.cc``. Everything else
  (norms, softmax, loss, AdamW) stays XLA's.

It answers what the performance issue asks before a custom call goes into the library: which
share of the gap to torch such a kernel closes, measured rather than estimated (``dot_gap.py``
estimates it from torch's per-shape times). bfloat16 products go through
``cblas_gemm_bf16bf16f32`` (AMX tiles where the CPU has them), float32 through ``cblas_sgemm``.

Needs MKL's library and headers in this Python's prefix and a C++ compiler:
``pip install mkl mkl-include`` (about 220 MB; not a dependency of the project). MKL runs
sequentially (``MKL_NUM_THREADS=1``), like the other two sides.

The first three losses of the three sides must agree (1e-4 in float32, 0.05 in bfloat16)
or the script stops. The last line is JSON: seconds per step of each side (medians of
process CPU time over turns), ``ratio_xla`` = torch / ours with XLA, and ``ratio`` = torch /
ours with MKL.

    python benchmarks/mkl_step.py [--precision bfloat16|float32] [--repeats 5] [--cpu N]
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("MKL_NUM_THREADS", "1")  # read when MKL loads
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pinning import pin_to_one_cpu  # noqa: E402

if __name__ == "__main__":
    CPU = pin_to_one_cpu(sys.argv[1:])  # before torch and JAX start their threads

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402

import train_step_vs_torch as ts  # noqa: E402  (sets XLA's and torch's thread settings)
from mkl_kernels import build_and_register, fail, mkl_matmul  # noqa: E402


from rlinf_jax.policies.lm import attention, from_pretrained, layers  # noqa: E402
from rlinf_jax.policies.lm.tiny import tiny_hf_model  # noqa: E402


def _dense(self, x):
    y = mkl_matmul(x.astype(self.dtype), self.kernel[...].astype(self.dtype)).astype(self.dtype)
    if self.bias is not None:
        y = y + self.bias[...].astype(self.dtype)
    return y


def _attention_products(a, b):
    B, K = a.shape[:2]
    out = mkl_matmul(a.reshape(B * K, *a.shape[2:]), b.reshape(B * K, *b.shape[2:]))
    return out.reshape(B, K, *out.shape[1:])


@contextlib.contextmanager
def routed_through_mkl():
    """Programs traced inside run their matrix products through MKL."""
    saved = layers.Dense.__call__, layers.tied_logits, attention.products
    layers.Dense.__call__ = _dense
    layers.tied_logits = lambda x, table: mkl_matmul(x, table, True)
    attention.products = _attention_products
    try:
        yield
    finally:
        layers.Dense.__call__, layers.tied_logits, attention.products = saved


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", choices=("float32", "bfloat16"), default="bfloat16")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3, help="training steps per timed turn")
    parser.add_argument("--repeats", type=int, default=5, help="timed turns per side")
    parser.add_argument("--cpu", type=int, help="the one CPU core to run on (default: the first this process may use)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as build_dir:
        build_and_register(build_dir)
        hf = tiny_hf_model("qwen2", seed=0, scale=0.1, attn_implementation="sdpa", **ts.MODEL)
        hf.save_pretrained(build_dir)
        xla_model, mkl_model = (from_pretrained(build_dir, dtype=args.precision, param_dtype="float32")
                                for _ in range(2))
    ids = ts.token_batch(args.batch, args.seq)
    sides = {"torch": ts.torch_trainer(hf, ids, args.precision), "ours_xla": ts.jax_trainer(xla_model, ids)}
    with routed_through_mkl():
        sides["ours_mkl"] = ts.jax_trainer(mkl_model, ids)
        losses = {"ours_mkl": [float(sides["ours_mkl"]()) for _ in range(3)]}  # traced here
    losses.update({name: [float(step()) for _ in range(3)] for name, step in sides.items() if name != "ours_mkl"})
    tolerance = 1e-4 if args.precision == "float32" else 0.05
    threads = os.environ["MKL_NUM_THREADS"]
    print(f"{args.precision}, batch {args.batch} x {args.seq}, one core, MKL_NUM_THREADS={threads}")
    for name, values in losses.items():
        print(f"losses {name:8s} " + " ".join(f"{v:.7f}" for v in values))
    worst = max(abs(a - b) for name in ("ours_xla", "ours_mkl") for a, b in zip(losses[name], losses["torch"]))
    if worst > tolerance:
        fail(f"losses disagree by {worst:.2e} (> {tolerance:g}): the sides do not train the same model")

    _, cpu = ts.timed_turns(list(sides.values()), args.steps, args.repeats)
    seconds = {name: statistics.median(c) for name, c in zip(sides, cpu)}
    for name, c in zip(sides, cpu):
        print(f"{name:8s} {seconds[name] * 1e3:6.1f} ms/step CPU  (turns: {', '.join(f'{t * 1e3:.0f}' for t in c)})")
    result = {
        "benchmark": "mkl_step",
        "precision": args.precision,
        "batch": args.batch,
        "seq": args.seq,
        "threads": 1,
        **{f"{name}_cpu_s_per_step": round(s, 5) for name, s in seconds.items()},
        "ratio_xla": round(seconds["torch"] / seconds["ours_xla"], 3),
        "ratio": round(seconds["torch"] / seconds["ours_mkl"], 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
