#!/usr/bin/env python
"""One core's rate on the 0.5B training step's matrix products, one backend per process:
``torch`` (float32 and bfloat16 tensors), or our ``kernels.matmul`` on ``xla`` (float32
operands, or bfloat16 ones for bfloat16 products) or ``mkl`` (float32 operands, products in
float32 or bfloat16, as ``actor.model.matmul=mkl`` runs them).

Shapes (Qwen2.5-0.5B, 4 x 128 tokens): ``up`` [512, 896] x [896, 4864], ``down`` [512, 4864]
x [4864, 896], ``head`` [512, 896] x [151936, 896]^T (the tied head), ``wgrad_up`` [896, 512]
x [512, 4864] and ``head_wgrad`` [151936, 512] x [512, 896] (weight gradients). Median of 5
calls after one warm-up, the process pinned to one core (``--cpu``, default the first it may
use) with one thread. The last line of stdout is one JSON object: GFLOP/s per product and
precision.

    python benchmarks/product_rates.py torch
    python benchmarks/product_rates.py mkl
    python benchmarks/product_rates.py xla
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pinning import pin_to_one_cpu  # noqa: E402  (no heavy imports: safe before the pinning)

if __name__ == "__main__":
    # Before torch, MKL or JAX start their thread pools: threads inherit the affinity.
    CPU = pin_to_one_cpu(sys.argv[1:])
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    ).strip()

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

TOKENS, HIDDEN, INTERMEDIATE, VOCAB = 4 * 128, 896, 4864, 151936  # Qwen2.5-0.5B at 4 x 128 tokens
# name: (rows, contraction, columns, the second operand stored transposed)
SHAPES = {
    "up": (TOKENS, HIDDEN, INTERMEDIATE, False),
    "down": (TOKENS, INTERMEDIATE, HIDDEN, False),
    "head": (TOKENS, HIDDEN, VOCAB, True),
    "wgrad_up": (HIDDEN, TOKENS, INTERMEDIATE, False),
    "head_wgrad": (VOCAB, TOKENS, HIDDEN, False),
}
PRECISIONS = ("float32", "bfloat16")


def median_seconds(call, n: int = 5) -> float:
    call()  # warm-up: compile, first-call costs
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def operands(m: int, k: int, n: int, trans_b: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k), np.float32), rng.standard_normal((n, k) if trans_b else (k, n), np.float32)


def torch_products(m, k, n, trans_b, precision):
    import torch

    torch.set_num_threads(1)
    a, b = (torch.from_numpy(x).to(getattr(torch, precision)) for x in operands(m, k, n, trans_b))
    return (lambda: a @ b.T) if trans_b else (lambda: a @ b)


def jax_products(backend, m, k, n, trans_b, precision):
    import jax
    import jax.numpy as jnp

    from rlinf_jax import kernels

    kernels.check_backend(backend, jnp.float32)
    a, b = (jnp.asarray(x) for x in operands(m, k, n, trans_b))
    if backend == "xla" and precision == "bfloat16":  # XLA's products on operands already in bfloat16
        a, b = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
    product = jax.jit(lambda a, b: kernels.matmul(a, b, backend, trans_b=trans_b, compute_dtype=jnp.dtype(precision)))
    return lambda: product(a, b).block_until_ready()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backend", choices=("torch", "xla", "mkl"))
    parser.add_argument("--cpu", type=int, help="the core to run on (default: the first this process may use)")
    args = parser.parse_args(argv)
    rates = {}
    for name, shape in SHAPES.items():
        for precision in PRECISIONS:
            call = (torch_products(*shape, precision) if args.backend == "torch"
                    else jax_products(args.backend, *shape, precision))
            m, k, n, _ = shape
            rates[f"{name}/{precision}"] = round(2 * m * k * n / median_seconds(call) / 1e9, 1)
            print(f"{args.backend} {name:10s} {precision:8s} {rates[f'{name}/{precision}']:7.1f} GFLOP/s")
    print(json.dumps({"benchmark": "product_rates", "backend": args.backend, "threads": 1, "cpu": CPU,
                      "gflops_per_s": rates}))


if __name__ == "__main__":
    main()
