"""QLoRA (Dettmers et al., 2023): LoRA over a frozen base stored in 4-bit NormalFloat (NF4).

The kernels LoRA adapts (`rlinf_jax.policies.lm.lora.TARGETS`) are stored as NF4: each
kernel is cut into blocks of ``BLOCK`` elements along its last axis (every other axis, a
stacked layer axis included, keeps blocks of its own), each block is divided by its absolute
maximum and every element rounded to the nearest of NF4's 16 levels, the quantiles of
N(0, 1) scaled to [-1, 1] (the paper's Appendix E). So ``w ~ level[code] * absmax(block)``,
off by at most half the widest gap between neighbouring levels (``MAX_ERROR``) times the
block's absolute maximum. Quantising and dequantising are qwix's (``qwix.quantize(w, "nf4")``,
``qwix.dequantize``, the ``qlora`` extra); the 4-bit codes are packed two to a byte here, so
every stored leaf is a plain ``uint8`` or float array that checkpoints, sharding rules and
device transfers take as they are. A kernel then costs ``0.5 + itemsize / BLOCK`` bytes an
element (0.5625 for a float32 kernel with blocks of 64, whose scales are float32: 1/7.1 of
its float32 bytes; 0.53 against 2 for bfloat16). Embeddings, the output head, norms and
biases keep their dtype, as in the paper.

In the stored state a quantised kernel's variable ``.../kernel`` becomes two,
``.../kernel/nf4_codes`` (``[..., out / 2]``, uint8) and ``.../kernel/nf4_scale``
(``[..., out / block]``, in the kernel's dtype), each with the kernel's logical axis names.
`QLoRA.merge` dequantises them inside the jitted step and hands LoRA's merge the dense state,
so the model, the sampler and LoRA itself run unchanged; the adapters train in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm.lora import LoRA, adapter_key

QTYPES = ("none", "nf4")
BLOCK = 64  # the paper's block size
# NF4's widest gap between neighbouring levels is between -1 and -0.6962: an element is at
# most half of it, times its block's absolute maximum, from its level.
MAX_ERROR = (1.0 - 0.6961928009986877) / 2
CODES, SCALE = "nf4_codes", "nf4_scale"


def block_size(n: int) -> int:
    """The block along a last axis of ``n`` elements: ``BLOCK``, or the largest even divisor
    of ``n`` below it (small test models); the codes pack in pairs, so ``n`` must be even."""
    if n % 2:
        raise BadInput(
            f"actor.model.base_qtype=nf4 packs two 4-bit codes a byte along each adapted kernel's last axis, "
            f"which has {n} elements here; give the model even projection sizes or set base_qtype=none"
        )
    return max(d for d in range(2, min(BLOCK, n) + 1, 2) if n % d == 0)


@jax.jit
def quantize_kernel(w: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(codes [..., n / 2] uint8, scale [..., n / block])`` of one kernel. The levels are
    chosen in float32 (qwix rounds to the nearest level), the scales kept in ``w``'s dtype."""
    import qwix  # optional (the qlora extra): only a run with base_qtype=nf4 needs it

    n = w.shape[-1]
    q = qwix.quantize(
        w.astype(jnp.float32), "nf4", channelwise_axes=tuple(range(w.ndim - 1)), tiled_axes={w.ndim - 1: block_size(n)},
        scale_dtype=w.dtype,
    )
    codes = q.qvalue.astype(jnp.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << 4), q.scale


def dequantize_kernel(codes: jax.Array, scale: jax.Array) -> jax.Array:
    """The kernel ``codes`` and ``scale`` stand for, in ``scale``'s dtype."""
    import qwix  # optional (the qlora extra): only a run with base_qtype=nf4 needs it

    pairs = jnp.stack([codes & 0xF, codes >> 4], axis=-1)
    values = pairs.reshape(*codes.shape[:-1], 2 * codes.shape[-1]).astype(jnp.uint4)
    return qwix.dequantize(qwix.QArray(values, scale, None, "nf4"))


def quantize_state(state, paths) -> nnx.State:
    """``state`` (an nnx.State) with the kernels at adapter keys ``paths`` stored in NF4."""
    paths = set(paths)
    flat = []
    for path, var in nnx.to_flat_state(state):
        if adapter_key(path) not in paths:
            flat.append((path, var))
            continue
        codes, scale = quantize_kernel(var.get_value())
        flat += [((*path, CODES), var.replace(codes)), ((*path, SCALE), var.replace(scale))]
    return nnx.from_flat_state(flat)


def is_quantized(state) -> bool:
    """Whether ``state`` holds NF4 kernels (`quantize_state`)."""
    return any(path[-1] == CODES for path, _ in nnx.to_flat_state(state))


def dequantize_state(state) -> nnx.State:
    """``state`` with its NF4 kernels back in their dtype (jit-friendly); a state without
    any comes back as it is."""
    if not is_quantized(state):
        return state
    entries = nnx.to_flat_state(state)
    scales = {path[:-1]: var.get_value() for path, var in entries if path[-1] == SCALE}
    flat = []
    for path, var in entries:
        if path[-1] == CODES:
            flat.append((path[:-1], var.replace(dequantize_kernel(var.get_value(), scales[path[:-1]]))))
        elif path[-1] != SCALE:
            flat.append((path, var))
    return nnx.from_flat_state(flat)


def dequantize_flat(stored: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A checkpoint's flattened parameters (dotted keys) with each ``<kernel>.codes`` /
    ``<kernel>.scale`` pair back as ``<kernel>``, on the host."""
    out = {k: v for k, v in stored.items() if not k.endswith((f".{CODES}", f".{SCALE}"))}
    for key, codes in stored.items():
        if key.endswith(f".{CODES}"):
            kernel = key.removesuffix(f".{CODES}")
            out[kernel] = np.asarray(dequantize_kernel(jnp.asarray(codes), jnp.asarray(stored[f"{kernel}.{SCALE}"])))
    return out


class QLoRA(LoRA):
    """LoRA whose frozen base is stored in NF4: `quantize` the dense base once, and `merge`
    dequantises it before adding the adapters (inside the jitted step)."""

    def __init__(self, base_state, rank: int, alpha: float, qtype: str = "nf4"):
        if qtype != "nf4":
            raise BadInput(f"actor.model.base_qtype={qtype!r}: QLoRA stores the base as nf4")
        super().__init__(base_state, rank, alpha)
        self.qtype = qtype

    def quantize(self, base_state) -> nnx.State:
        """The dense base as it is stored: every adapted kernel in NF4."""
        return quantize_state(base_state, self.targets)

    def merge(self, base, adapters):
        """The dense weights of the stored (quantised) ``base`` with ``W + scale * A @ B``."""
        return super().merge(dequantize_state(base), adapters)

    def meta(self) -> dict:
        return {**super().meta(), "base_qtype": self.qtype}
