#!/usr/bin/env python
"""Our PPO on Brax with the actor-critic's dense layers routed through MKL (a ``jax.ffi``
custom call, `rlinf_jax.kernels.mkl`), to measure whether a faster matrix-product kernel would
move the PPO-vs-Brax ratio.

Runs ``ppo_vs_brax.py --only ours`` with ``actor.model.compute_dtype`` set by
``--precision`` and, with ``--products mkl``, every ``nnx.Linear`` of the policy and value
networks computing its product through MKL (bfloat16 on the CPU's AMX tiles, float32
through ``cblas_sgemm``), forward and backward. Everything else is unchanged. Arguments
after ``--`` go to ``ppo_vs_brax.py``; its last line (JSON) is this script's last line.
MKL threads: ``MKL_NUM_THREADS`` (default 1). Needs ``pip install -e ".[mkl]"`` and a
C++ compiler.

    python benchmarks/mkl_ppo.py --products mkl --precision bfloat16 [-- --env inverted_pendulum]
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("MKL_NUM_THREADS", "1")  # read when MKL loads
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ppo_vs_brax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402
from rlinf_jax.errors import BadInput  # noqa: E402
from rlinf_jax.kernels.mkl import mkl_matmul, register  # noqa: E402


def _linear(self, x):
    """``nnx.Linear``'s product through MKL, in the layer's compute dtype."""
    dtype = self.dtype or x.dtype
    # The float32 weight goes in as it is: for a bfloat16 product the kernel library rounds
    # it once per program (kernels.mkl.round_bf16) and returns its gradient in float32.
    flat = x.reshape(-1, x.shape[-1])
    if flat.dtype != jnp.bfloat16:
        flat = flat.astype(jnp.float32)
    y = mkl_matmul(flat, self.kernel[...], False, jnp.float32, dtype).reshape(*x.shape[:-1], -1)
    return (y if self.bias is None else y + self.bias[...]).astype(dtype)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--products", choices=("xla", "mkl"), default="mkl")
    parser.add_argument("--precision", choices=("float32", "bfloat16"), default="bfloat16")
    args = parser.parse_args(argv[:split])

    make_config = ppo_vs_brax.make_config

    def with_precision(a):
        cfg = make_config(a)
        cfg.actor.model.compute_dtype = args.precision
        return cfg

    ppo_vs_brax.make_config = with_precision
    if args.products == "mkl":
        try:
            register()
        except BadInput as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        nnx.Linear.__call__ = _linear
    threads = os.environ["MKL_NUM_THREADS"]
    print(f"products: {args.products}, precision: {args.precision}, MKL_NUM_THREADS={threads}", file=sys.stderr)
    return ppo_vs_brax.main(["--only", "ours", *argv[split + 1 :]])


if __name__ == "__main__":
    sys.exit(main())
