"""Intel MKL's matrix products as an XLA CPU custom call (``jax.ffi``).

XLA's CPU backend runs bfloat16 products slower than float32 ones, while MKL's
``cblas_gemm_bf16bf16f32`` runs them on the AMX tiles of CPUs that have them: with every
product of the LM training step routed here, its bfloat16 step went from 0.6x torch's to
parity (``benchmarks/train_step_vs_torch.py --matmul mkl``).

The kernel (``mkl_products.cc``) is compiled on first use with the system's C++ compiler
against the MKL that ``pip install -e ".[mkl]"`` puts in this Python's prefix, and cached
under ``$RLINF_JAX_KERNEL_CACHE`` (default ``~/.cache/rlinf_jax/kernels``), keyed by the
source, the JAX version, the MKL library and the CPU's features, so later runs only load
it. MKL runs one thread per product unless ``MKL_NUM_THREADS`` says otherwise (`register`).
"""

from __future__ import annotations

import ctypes
import functools
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from rlinf_jax.errors import BadInput

SOURCE = Path(__file__).with_name("mkl_products.cc")
_TARGETS = {"mkl_gemm_f32": "MklGemmF32", "mkl_gemm_bf16": "MklGemmBf16", "rlinf_round_bf16": "RoundBf16",
            "rlinf_token_logprobs_fwd": "TokenLogprobsForward", "rlinf_token_logprobs_bwd": "TokenLogprobsBackward",
            "rlinf_swiglu_fwd": "SwigluForward", "rlinf_swiglu_bwd": "SwigluBackward"}
# The compute dtypes the kernel has a product for.
DTYPES = ("float32", "bfloat16")
_INSTALL = 'pip install -e ".[mkl]" (or pip install mkl mkl-include)'


def _mkl_files() -> tuple[Path, Path]:
    """MKL's header folder and runtime library: under ``$MKLROOT`` if set, else this prefix."""
    roots = [Path(os.environ["MKLROOT"])] if os.environ.get("MKLROOT") else []
    roots.append(Path(sys.prefix))
    for root in roots:
        libs = sorted(glob.glob(str(root / "lib" / "libmkl_rt.so*")))
        if (root / "include" / "mkl_cblas.h").is_file() and libs:
            return root / "include", Path(libs[0])
    raise BadInput(f"actor.model.matmul=mkl needs Intel MKL's library and headers, found under none of "
                   f"{', '.join(map(str, roots))}; run {_INSTALL}")


def available() -> bool:
    """Whether MKL's library and headers are installed (the kernel may still need a compiler)."""
    try:
        _mkl_files()
        return True
    except BadInput:
        return False


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


def cache_dir() -> Path:
    return Path(os.environ.get("RLINF_JAX_KERNEL_CACHE") or Path.home() / ".cache" / "rlinf_jax" / "kernels")


def build() -> Path:
    """The compiled kernel library, built now unless a cached build of the same inputs exists."""
    include, lib = _mkl_files()
    # Built for this CPU (-march=native): its feature flags are part of the key, so a cache
    # shared between different machines holds one build for each.
    inputs = f"{jax.__version__}|{lib.resolve()}|{_cpu_flags()}"
    key = hashlib.sha256(SOURCE.read_bytes() + inputs.encode()).hexdigest()[:16]
    out = cache_dir() / f"mkl_products-{key}.so"
    if out.is_file():
        return out
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise BadInput("actor.model.matmul=mkl compiles a small C++ kernel on first use: install a C++ compiler "
                       "(g++), or set actor.model.matmul=xla")
    out.parent.mkdir(parents=True, exist_ok=True)
    # Built under a temporary name and renamed, so processes building at once never load a
    # half-written library.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    cmd = [compiler, "-O3", "-march=native", "-fopenmp-simd", "-std=c++17", "-shared", "-fPIC", "-w", f"-I{jax.ffi.include_dir()}",
           f"-I{include}", str(SOURCE), "-o", tmp, str(lib), f"-Wl,-rpath,{lib.parent}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        os.unlink(tmp)
        raise BadInput(f"compiling the MKL kernel failed ({' '.join(cmd)}):\n{done.stderr[-2000:]}")
    os.replace(tmp, out)
    return out


@functools.cache
def register() -> None:
    """Builds (or loads) the kernel and registers its custom-call targets, once per process.

    MKL then runs each product on one thread unless ``MKL_NUM_THREADS`` says otherwise: XLA
    already runs independent operations side by side on its own threads, and MKL's threads
    competing with them made the SAC trainer 24% slower on the 2-core CPU (0.99 against
    1.30 of Brax's env steps/s, ``benchmarks/sac_vs_brax.py --matmul mkl --compute-dtype
    bfloat16``).
    """
    lib = ctypes.cdll.LoadLibrary(str(build()))
    if not os.environ.get("MKL_NUM_THREADS"):
        ctypes.CDLL(str(_mkl_files()[1])).MKL_Set_Num_Threads(ctypes.c_int(1))  # the C entry point
    for target, symbol in _TARGETS.items():
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")


def _call(a, b, trans_a: bool, trans_b: bool, out_dtype, compute_dtype):
    """``op(a) @ op(b)`` computed in ``compute_dtype``, accumulated in float32 and returned in
    ``out_dtype`` (float32 or bfloat16): 2-D operands, or 3-D with one product per leading
    index. For a bfloat16 product either operand may be float32: the kernel rounds it."""
    register()
    rows = a.shape[-1] if trans_a else a.shape[-2]
    cols = b.shape[-2] if trans_b else b.shape[-1]
    target = "mkl_gemm_bf16" if jnp.dtype(compute_dtype) == jnp.bfloat16 else "mkl_gemm_f32"
    out = jax.ShapeDtypeStruct((*a.shape[:-2], rows, cols), out_dtype)
    call = jax.ffi.ffi_call(target, out, vmap_method="sequential")
    return call(a, b, trans_a=trans_a, trans_b=trans_b)


def round_bf16(x):
    """``x.astype(bfloat16)`` of a float32 array, in one pass of the kernel library's
    vectorised rounding (the same rounding as XLA's convert, which runs as a scalar loop)."""
    register()
    return jax.ffi.ffi_call("rlinf_round_bf16", jax.ShapeDtypeStruct(x.shape, jnp.bfloat16),
                            vmap_method="broadcast_all")(x)


def _rounded_weight(b, compute):
    # A float32 weight of a bfloat16 product is rounded once by its own call, which XLA's
    # common-subexpression pass shares between every product that reads the same weight in
    # a program (a forward and its backward, two losses reading one critic), rather than in
    # each product's kernel.
    return round_bf16(b) if jnp.dtype(compute) == jnp.bfloat16 and b.dtype == jnp.float32 else b


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def mkl_matmul(a, b, trans_b: bool = False, out_dtype=jnp.float32, compute_dtype=None):
    """``a @ b`` (``a @ b.T`` with ``trans_b``) through MKL in ``compute_dtype`` (float32 or
    bfloat16; None: ``a``'s dtype), accumulated in float32 and returned in ``out_dtype``.

    ``a`` and ``b`` are 2-D, or 3-D with a shared leading batch axis. They are in the compute
    dtype, or float32 for a bfloat16 product: a float32 ``b`` (the weight) is then rounded
    once per program by `round_bf16`, a float32 ``a`` inside the product's kernel, which
    spares XLA a convert on every use. Gradients come out in the operands' dtypes, computed
    in the same dtype as the forward product.
    """
    compute = compute_dtype or a.dtype
    return _call(a, _rounded_weight(b, compute), False, trans_b, out_dtype, compute)


def _matmul_fwd(a, b, trans_b, out_dtype, compute_dtype):
    compute = compute_dtype or a.dtype
    b_c = _rounded_weight(b, compute)
    return _call(a, b_c, False, trans_b, out_dtype, compute), (a, b, b_c)


def _matmul_bwd(trans_b, out_dtype, compute_dtype, residuals, g):
    a, b, b_c = residuals  # b_c: b in the compute dtype
    compute = compute_dtype or a.dtype
    if jnp.dtype(compute) == jnp.float32:
        g = g.astype(jnp.float32)
    if trans_b:  # y = a b^T: da = g b, db = g^T a
        return _call(g, b_c, False, False, a.dtype, compute), _call(g, a, True, False, b.dtype, compute)
    # y = a b: da = g b^T, db = a^T g
    return _call(g, b_c, False, True, a.dtype, compute), _call(a, g, True, False, b.dtype, compute)


mkl_matmul.defvjp(_matmul_fwd, _matmul_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def token_logprobs(logits, tokens, temperature: float = 1.0):
    """``(log pi(token), entropy)`` of ``softmax(logits / temperature)`` per row: float32
    ``logits [..., vocab]``, integer ``tokens [...]``; the kernel library's row-at-a-time
    pass (see ``mkl_products.cc``), with the same numbers as
    `rlinf_jax.policies.lm.logprobs.token_logprobs` to float tolerance."""
    return _token_logprobs_fwd(logits, tokens, temperature)[0]


def _token_logprobs_fwd(logits, tokens, temperature):
    register()
    rows = jax.ShapeDtypeStruct(tokens.shape, jnp.float32)
    logp, entropy, lse, mean_z = jax.ffi.ffi_call("rlinf_token_logprobs_fwd", (rows,) * 4, vmap_method="sequential")(
        logits, tokens.astype(jnp.int32), inv_t=np.float32(1.0 / temperature))
    return (logp, entropy), (logits, tokens, lse, mean_z)


def _token_logprobs_bwd(temperature, residuals, g):
    logits, tokens, lse, mean_z = residuals
    g_logp, g_ent = (x.astype(jnp.float32) for x in g)
    dx = jax.ffi.ffi_call("rlinf_token_logprobs_bwd", jax.ShapeDtypeStruct(logits.shape, jnp.float32),
                          vmap_method="sequential")(
        logits, tokens.astype(jnp.int32), lse, mean_z, g_logp, g_ent, inv_t=np.float32(1.0 / temperature))
    return dx, None


token_logprobs.defvjp(_token_logprobs_fwd, _token_logprobs_bwd)


@jax.custom_vjp
def swiglu(gate, up):
    """``silu(gate) * up`` of float32 arrays of one shape, in the kernel library (a block of
    elements at a time in cache; see ``mkl_products.cc``), with its own backward pass."""
    return _swiglu_fwd(gate, up)[0]


def _swiglu_fwd(gate, up):
    register()
    out = jax.ffi.ffi_call("rlinf_swiglu_fwd", jax.ShapeDtypeStruct(gate.shape, jnp.float32),
                           vmap_method="broadcast_all")(gate, up)
    return out, (gate, up)


def _swiglu_bwd(residuals, dh):
    gate, up = residuals
    shape = jax.ShapeDtypeStruct(gate.shape, jnp.float32)
    return tuple(jax.ffi.ffi_call("rlinf_swiglu_bwd", (shape, shape), vmap_method="broadcast_all")(
        gate, up, dh.astype(jnp.float32)))


swiglu.defvjp(_swiglu_fwd, _swiglu_bwd)
