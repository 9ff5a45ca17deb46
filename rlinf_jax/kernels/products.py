"""One matrix product, through the backend a model was built with (``actor.model.matmul``).

``xla`` is XLA's own dot, on every platform. ``mkl`` is Intel MKL through a CPU custom call
(`rlinf_jax.kernels.mkl`): for CPUs with AMX tiles, where XLA's bfloat16 products are slow.
A custom call has no partitioning rule, so ``mkl`` runs on one CPU device.
"""

from __future__ import annotations

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
           out_dtype=jnp.float32) -> jax.Array:
    """``a @ b`` (``a @ b^T`` with ``trans_b``), accumulated in float32, returned in
    ``out_dtype``.

    ``a`` is ``[..., M, K]`` and ``b`` ``[..., K, N]`` (``[..., N, K]`` with ``trans_b``), both in
    the compute dtype, with the same leading axes.
    """
    if backend == "xla":
        out = jnp.matmul(a, jnp.swapaxes(b, -1, -2) if trans_b else b, preferred_element_type=jnp.float32)
        return out.astype(out_dtype)
    if backend != "mkl":
        raise ValueError(f"unknown matmul backend {backend!r}")
    lead = a.shape[:-2]
    if len(lead) > 1:  # the kernel takes one leading axis: fold the rest into it
        out = mkl.mkl_matmul(a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:]), trans_b, out_dtype)
        return out.reshape(*lead, *out.shape[-2:])
    return mkl.mkl_matmul(a, b, trans_b, out_dtype)
