#!/usr/bin/env python
"""One core's rate on the 0.5B training step's matrix products, one backend per process:
torch (float32 and bfloat16 tensors), or our ``kernels.matmul`` on ``xla`` or ``mkl`` (float32
operands, products in float32 or bfloat16, as ``actor.model.matmul`` runs them).

Shapes (Qwen2.5-0.5B, 4 x 128 tokens): ``up`` [512, 896] x [896, 4864], ``down`` [512, 4864] x
[4864, 896], ``head`` [512, 896] x [151936, 896]^T (the tied head), ``wgrad_up`` [896, 512] x
[512, 4864] and ``head_wgrad`` [151936, 512] x [512, 896] (weight gradients). Median of 5 calls
after one warm-up, pinned to core 0 with one thread.

    python benchmarks/product_rates.py torch
    python benchmarks/product_rates.py mkl
    python benchmarks/product_rates.py xla
"""

import os
import sys
import time

os.sched_setaffinity(0, {0})
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
side = sys.argv[1] if len(sys.argv) == 2 else ""
if side not in ("torch", "xla", "mkl"):
    print("usage: python benchmarks/product_rates.py torch|xla|mkl", file=sys.stderr)
    sys.exit(2)
SHAPES = {"up": (512, 896, 4864, False), "down": (512, 4864, 896, False), "head": (512, 896, 151936, True),
          "wgrad_up": (896, 512, 4864, False), "head_wgrad": (151936, 512, 896, False)}
import numpy as np  # noqa: E402


def tm(f, n=5):
    f(); ts=[]
    for _ in range(n):
        t=time.perf_counter(); f(); ts.append(time.perf_counter()-t)
    return sorted(ts)[n//2]


if side == "torch":
    import torch; torch.set_num_threads(1)
    for name,(m,k,n,tb) in SHAPES.items():
        for dt in (torch.float32, torch.bfloat16):
            a=torch.randn(m,k).to(dt); b=torch.randn(n,k).to(dt) if tb else torch.randn(k,n).to(dt)
            f=(lambda: a@b.T) if tb else (lambda: a@b)
            t=tm(f); print(f"torch {name:10s} {str(dt):15s} {2*m*k*n/t/1e9:7.1f} GFLOP/s")
else:
    import jax, jax.numpy as jnp
    from rlinf_jax import kernels
    kernels.check_backend(side, jnp.float32)
    for name,(m,k,n,tb) in SHAPES.items():
        for cd in (jnp.float32, jnp.bfloat16):
            a=jnp.asarray(np.random.randn(m,k),jnp.float32); b=jnp.asarray(np.random.randn(n,k) if tb else np.random.randn(k,n),jnp.float32)
            if side=="xla" and cd==jnp.bfloat16: a,b=a.astype(cd),b.astype(cd)
            g=jax.jit(lambda a,b: kernels.matmul(a,b,side,trans_b=tb,compute_dtype=cd))
            f=lambda: g(a,b).block_until_ready()
            t=tm(f); print(f"{side} {name:10s} {str(cd.dtype if hasattr(cd,'dtype') else cd):15s} {2*m*k*n/t/1e9:7.1f} GFLOP/s")
