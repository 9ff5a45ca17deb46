"""Building blocks of the causal LM: dense layers, RMSNorm, embeddings, rotary embeddings.

Dense layers take 2-D activations ``[tokens, features]``: XLA on CPU runs (and differentiates)
plain matmuls markedly faster than 3-D einsums, so the model flattens batch and time once and
reshapes only where attention needs heads. Every parameter carries logical axis names
(``vocab``, ``embed``, ``mlp``, ``q_heads``, ``kv_heads``, ``head_dim``, ``norm``) that the
sharding rules map onto mesh axes; the names are metadata only and never shard eagerly here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlinf_jax import kernels

# Hugging Face initialises these models with N(0, 0.02); only matters for from-scratch models.
INIT_STD = 0.02


def param(rngs: nnx.Rngs, init, shape, dtype, axes: tuple[str, ...]) -> nnx.Param:
    """An ``nnx.Param`` annotated with logical axis names (metadata, no eager sharding)."""
    return nnx.Param(nnx.with_partitioning(init, axes, eager_sharding=False)(rngs.params(), shape, dtype))


class Dense(nnx.Module):
    """``x @ kernel (+ bias)`` on ``[tokens, in]`` activations; kernel stored ``[in, out]``."""

    def __init__(self, in_features, out_features, axes, *, use_bias, dtype, param_dtype, rngs, matmul="xla"):
        self.dtype = dtype
        self.matmul = matmul  # the product's backend (`rlinf_jax.kernels`)
        self.kernel = param(rngs, nnx.initializers.normal(INIT_STD), (in_features, out_features), param_dtype, axes)
        self.bias = param(rngs, nnx.initializers.zeros, (out_features,), param_dtype, axes[1:]) if use_bias else None

    def __call__(self, x: jax.Array) -> jax.Array:
        x, kernel = x.astype(self.dtype), self.kernel[...].astype(self.dtype)
        if self.matmul == "xla":
            y = jnp.dot(x, kernel)
        else:
            y = kernels.matmul(x, kernel, self.matmul, out_dtype=self.dtype)
        if self.bias is not None:
            y = kernels.add_bias(y, self.bias[...].astype(self.dtype), self.matmul)
        return y




class RMSNorm(nnx.Module):
    """``x / rms(x) * scale`` over the last axis, computed in float32.

    Llama's form multiplies by the weight itself; Gemma's (``unit_offset=True``) by
    ``1 + weight``, so its checkpoints store weights around 0 and an all-zero weight is the
    identity (it is initialised that way here too).
    """

    def __init__(self, size, *, eps, dtype, param_dtype, rngs, unit_offset: bool = False):
        self.eps = eps
        self.dtype = dtype
        self.unit_offset = unit_offset
        init = nnx.initializers.zeros if unit_offset else nnx.initializers.ones
        self.scale = param(rngs, init, (size,), param_dtype, ("norm",))

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        scale = self.scale[...].astype(jnp.float32)
        return (normed * (1.0 + scale if self.unit_offset else scale)).astype(self.dtype)


class AdaRMSNorm(nnx.Module):
    """Adaptive RMSNorm (pi0.5's action expert): ``x / rms(x) * (1 + scale) + shift``, where
    ``scale, shift, gate = dense(cond)`` come from a per-row conditioning vector (the flow
    time's embedding) instead of a learned weight. ``gate`` multiplies the branch that the
    normalised input feeds before it joins the residual stream (`Block`).

    The dense kernel starts at zero, as openpi's does, so a fresh model's blocks start as the
    identity (gate 0) and learn to open; converted checkpoints overwrite it.
    """

    def __init__(self, size, cond_dim, *, eps, dtype, param_dtype, rngs):
        self.eps = eps
        self.dtype = dtype
        self.size = size
        self.dense = Dense(cond_dim, 3 * size, (None, "norm"), use_bias=True, dtype=jnp.float32,
                           param_dtype=param_dtype, rngs=rngs)
        self.dense.kernel.set_value(jnp.zeros_like(self.dense.kernel.get_value()))

    def __call__(self, x: jax.Array, cond: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``x [B*T, size]``, ``cond [B, cond_dim]`` -> (normalised ``[B*T, size]``, gate
        ``[B, size]`` float32)."""
        B = cond.shape[0]
        x32 = x.astype(jnp.float32).reshape(B, -1, self.size)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        scale, shift, gate = jnp.split(self.dense(cond.astype(jnp.float32)), 3, axis=-1)
        out = normed * (1.0 + scale[:, None]) + shift[:, None]
        return out.reshape(x.shape).astype(self.dtype), gate


def gated(branch: jax.Array, gate: jax.Array | None) -> jax.Array:
    """``branch [B*T, E]`` times the per-row ``gate [B, E]`` of an `AdaRMSNorm` (``branch``
    itself when there is no gate)."""
    if gate is None:
        return branch
    B, E = gate.shape
    return (branch.reshape(B, -1, E) * gate[:, None].astype(branch.dtype)).reshape(branch.shape)


class Embed(nnx.Module):
    """Token embedding table ``[vocab, embed]``; also the output projection when tied.

    ``scale`` multiplies looked-up embeddings (Gemma: ``sqrt(embed)``), rounded to the compute
    dtype first as transformers does (``sqrt(2048)`` is 45.25 in bfloat16); the tied output
    projection uses the table unscaled.
    """

    def __init__(self, vocab_size, features, *, dtype, param_dtype, rngs, scale: float | None = None, matmul="xla"):
        self.dtype = dtype
        self.matmul = matmul  # the tied output head's backend (`rlinf_jax.kernels`)
        self.scale = scale
        self.embedding = param(
            rngs, nnx.initializers.normal(INIT_STD), (vocab_size, features), param_dtype, ("vocab", "embed")
        )

    def __call__(self, ids: jax.Array) -> jax.Array:
        out = jnp.take(self.embedding[...], ids, axis=0).astype(self.dtype)
        if self.scale is not None:
            out = out * jnp.asarray(self.scale, self.dtype)
        return out

    def attend(self, x: jax.Array) -> jax.Array:
        """Tied output logits ``x @ embedding.T`` in float32, ``x`` as ``[tokens, embed]``."""
        x, table = x.astype(self.dtype), self.embedding[...].astype(self.dtype)
        if self.matmul == "xla":
            return tied_logits(x, table)
        return kernels.matmul(x, table, self.matmul, trans_b=True)


@jax.custom_vjp
def tied_logits(x: jax.Array, table: jax.Array) -> jax.Array:
    """``x [N, E] @ table [V, E].T`` accumulated in float32: the output head of a model whose
    embedding table is tied to it.

    Its own backward pass only to choose the form of the table's gradient. Autodiff asks for
    ``g.T @ x`` (``[V, E]``, the ``[N, V]`` logit gradient read transposed), and XLA CPU ran
    that product at about half the speed of ``x.T @ g`` (``[E, V]``, the small ``[N, E]``
    operand read transposed), the largest single product of a training step
    (benchmarks/README.md, "Measurements behind choices in the code"). The barrier keeps XLA from folding the final
    transpose back into the product.
    """
    return jnp.dot(x, table.T, preferred_element_type=jnp.float32)


def _tied_logits_fwd(x, table):
    return tied_logits(x, table), (x, table)


def _tied_logits_bwd(residuals, g):
    x, table = residuals
    g = g.astype(x.dtype)
    dx = jnp.dot(g, table, preferred_element_type=jnp.float32).astype(x.dtype)
    dtable_t = jax.lax.optimization_barrier(jnp.dot(x.T, g, preferred_element_type=jnp.float32))
    return dx, dtable_t.T.astype(table.dtype)


tied_logits.defvjp(_tied_logits_fwd, _tied_logits_bwd)


def rope_tables(
    positions: jax.Array, inv_freq: np.ndarray, num_positions: int | None = None
) -> tuple[jax.Array, jax.Array]:
    """cos and sin ``[B, T, head_dim]`` in float32 for integer ``positions [B, T]``.

    Hugging Face layout: the half-dimension frequencies are repeated, ``[f, f]``, to pair with
    ``rotate_half`` (not interleaved pairs as in the original RoPE paper).

    With ``num_positions`` (every position is known to lie in ``[0, num_positions)``), cos and
    sin are evaluated once per position and gathered; same values. Evaluated on the
    ``[B, T, head_dim]`` angles instead, XLA fuses them into every op that reads the tables
    and recomputes them there: per head, in the forward and the backward pass, in each layer
    (6% of a training step of a 4-layer model on XLA CPU).
    """
    inv_freq = jnp.asarray(inv_freq, jnp.float32)
    if num_positions is None:
        freqs = positions.astype(jnp.float32)[..., None] * inv_freq
        angles = jnp.concatenate([freqs, freqs], axis=-1)
        return jnp.cos(angles), jnp.sin(angles)
    freqs = jnp.arange(num_positions, dtype=jnp.float32)[:, None] * inv_freq
    angles = jnp.concatenate([freqs, freqs], axis=-1)
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    return jnp.take(cos, positions, axis=0, mode="clip"), jnp.take(sin, positions, axis=0, mode="clip")


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate ``x [B, T, heads, head_dim]`` by the tables of ``rope_tables``, in float32."""
    x32 = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    out = x32 * cos[:, :, None, :] + rotated * sin[:, :, None, :]
    return out.astype(x.dtype)
