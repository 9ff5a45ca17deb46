"""Intel MKL's matrix products as an XLA CPU custom call (``jax.ffi``), for benchmarks that
measure what such a kernel would buy: built from ``mkl_ffi.cc`` against the MKL in this
Python's prefix (``pip install mkl mkl-include``) with the system's C++ compiler."""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mkl_ffi.cc")


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def build_and_register(out_dir: str) -> None:
    """Compiles ``mkl_ffi.cc`` against this prefix's MKL and registers its two targets."""
    compiler = shutil.which("g++") or shutil.which("c++")
    include = os.path.join(sys.prefix, "include")
    libs = sorted(glob.glob(os.path.join(sys.prefix, "lib", "libmkl_rt.so*")))
    if compiler is None:
        fail("no C++ compiler (g++ or c++) on PATH; install one to build the MKL custom call")
    if not os.path.exists(os.path.join(include, "mkl_cblas.h")) or not libs:
        fail(f"MKL's headers or library are not under {sys.prefix}; run `pip install mkl mkl-include`")
    out = os.path.join(out_dir, "libmkl_ffi.so")
    cmd = [compiler, "-O2", "-std=c++17", "-shared", "-fPIC", "-w", f"-I{jax.ffi.include_dir()}", f"-I{include}",
           SOURCE, "-o", out, libs[0], f"-Wl,-rpath,{os.path.dirname(libs[0])}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        fail(f"building {SOURCE} failed:\n{done.stderr[-2000:]}")
    lib = ctypes.cdll.LoadLibrary(out)
    jax.ffi.register_ffi_target("mkl_gemm_f32", jax.ffi.pycapsule(lib.MklGemmF32), platform="cpu")
    jax.ffi.register_ffi_target("mkl_gemm_bf16", jax.ffi.pycapsule(lib.MklGemmBf16), platform="cpu")


def _call(a, b, trans_a: bool, trans_b: bool):
    """``op(a) @ op(b)`` in float32 out; 2-D operands, or 3-D with one product per leading index."""
    rows = a.shape[-1] if trans_a else a.shape[-2]
    cols = b.shape[-2] if trans_b else b.shape[-1]
    target = "mkl_gemm_bf16" if a.dtype == jnp.bfloat16 else "mkl_gemm_f32"
    out = jax.ShapeDtypeStruct((*a.shape[:-2], rows, cols), jnp.float32)
    return jax.ffi.ffi_call(target, out)(a, b, trans_a=trans_a, trans_b=trans_b)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def mkl_matmul(a, b, trans_b: bool = False):
    """``a @ b`` (``a @ b.T`` with ``trans_b``) through MKL, float32 out."""
    return _call(a, b, False, trans_b)


def _matmul_fwd(a, b, trans_b):
    return mkl_matmul(a, b, trans_b), (a, b)


def _matmul_bwd(trans_b, residuals, g):
    a, b = residuals
    g = g.astype(a.dtype)
    if trans_b:  # y = a b^T: da = g b, db = g^T a
        da, db = _call(g, b, False, False), _call(g, a, True, False)
    else:  # y = a b: da = g b^T, db = a^T g
        da, db = _call(g, b, False, True), _call(a, g, True, False)
    return da.astype(a.dtype), db.astype(b.dtype)


mkl_matmul.defvjp(_matmul_fwd, _matmul_bwd)
