"""One matrix product, through the backend a model was built with (``actor.model.matmul``).

``xla`` is XLA's own dot, on every platform. ``mkl`` is Intel MKL through a CPU custom call
(`rlinf_jax.kernels.mkl`): for CPUs with AMX tiles, where XLA's bfloat16 products are slow.
A custom call has no partitioning rule, so ``mkl`` runs on one CPU device.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rlinf_jax.errors import BadInput
from rlinf_jax.kernels import mkl

BACKENDS = ("xla", "mkl")


def check_name(backend: str) -> None:
    """Raises `BadInput` unless ``backend`` names a backend (a config check: builds nothing)."""
    if backend not in BACKENDS:
        raise BadInput(f"actor.model.matmul={backend!r} is unknown; choose one of {', '.join(BACKENDS)}")


def check_backend(backend: str, dtype, num_devices: int = 1) -> None:
    """Raises `BadInput` unless ``backend`` can run products in ``dtype`` here, for a run on
    ``num_devices`` devices (building the MKL kernel now, when it is asked for and not yet
    cached, so that a run fails before it builds anything else)."""
    check_name(backend)
    if backend == "xla":
        return
    if jnp.dtype(dtype).name not in mkl.DTYPES:
        raise BadInput(f"actor.model.matmul=mkl computes in {' or '.join(mkl.DTYPES)}, not {jnp.dtype(dtype).name}; "
                       "set actor.model.dtype to one of them, or actor.model.matmul=xla")
    if num_devices > 1:
        raise BadInput(
            f"actor.model.matmul={backend} runs its custom call on one device, and this run uses {num_devices}: "
            "set cluster.num_devices=1, or actor.model.matmul=xla"
        )
    if jax.default_backend() != "cpu":
        raise BadInput(f"actor.model.matmul=mkl runs on CPUs; this run's platform is {jax.default_backend()}: "
                       "set actor.model.matmul=xla")
    mkl.register()


def matmul(a: jax.Array, b: jax.Array, backend: str = "xla", *, trans_b: bool = False,
           out_dtype=jnp.float32, compute_dtype=None) -> jax.Array:
    """``a @ b`` (``a @ b^T`` with ``trans_b``) in ``compute_dtype``, accumulated in float32,
    returned in ``out_dtype``.

    ``a`` is ``[..., M, K]`` and ``b`` ``[..., K, N]`` (``[..., N, K]`` with ``trans_b``), with the
    same leading axes. ``compute_dtype`` None: both are in the compute dtype already. Else
    they are cast to it: by XLA on the ``xla`` backend; on ``mkl`` float32 operands of a
    bfloat16 product are rounded by the kernel library (see `mkl.mkl_matmul`), where XLA's
    convert of each weight cost a fifth of a bfloat16 SAC step (benchmarks/sac_grad_step.py).
    """
    if backend == "xla":
        if compute_dtype is not None:
            a, b = a.astype(compute_dtype), b.astype(compute_dtype)
        out = jnp.matmul(a, jnp.swapaxes(b, -1, -2) if trans_b else b, preferred_element_type=jnp.float32)
        return out.astype(out_dtype)
    if backend != "mkl":
        raise ValueError(f"unknown matmul backend {backend!r}")
    if compute_dtype is not None and jnp.dtype(compute_dtype) == jnp.float32:
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    lead = a.shape[:-2]
    if len(lead) > 1:  # the kernel takes one leading axis: fold the rest into it
        out = mkl.mkl_matmul(a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:]), trans_b, out_dtype,
                             compute_dtype)
        return out.reshape(*lead, *out.shape[-2:])
    return mkl.mkl_matmul(a, b, trans_b, out_dtype, compute_dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def add_bias(y: jax.Array, bias: jax.Array, backend: str = "xla") -> jax.Array:
    """``y [..., M, N] + bias``, with ``bias`` ``[N]`` or ``[..., 1, N]`` (one row per leading
    index), whose gradient (a sum of ``y``'s gradient over rows) is a product with a row of
    ones through ``backend``.

    Autodiff's column sum ran on XLA CPU as a tree of reduce-windows (or a YNNPACK
    reduction), far below the memory's rate (benchmarks/README.md, "Measurements behind choices in the code"). The product reads the
    gradient once, at the product's rate.
    """
    return y + bias


def _add_bias_fwd(y, bias, backend):
    return y + bias, bias.ndim


def _add_bias_bwd(backend, bias_ndim, g):
    if bias_ndim == 1:
        rows = g.reshape(-1, g.shape[-1])
        ones = jnp.ones((1, rows.shape[0]), g.dtype)
        return g, matmul(ones, rows, backend)[0].astype(g.dtype)
    ones = jnp.ones((*g.shape[:-2], 1, g.shape[-2]), g.dtype)
    return g, matmul(ones, g, backend).astype(g.dtype)


add_bias.defvjp(_add_bias_fwd, _add_bias_bwd)
