"""Grouped-query self-attention with an optional static KV cache.

The cache holds keys as ``[B, kv_heads, head_dim, S]`` and values as ``[B, kv_heads, S,
head_dim]`` per layer (a scanned model stacks the layers, ``[L, ...]``), so both attention
products are plain ``[rows, k] x [k, cols]`` matmuls over the cache. XLA CPU repacks a
transposed right operand on every call, so keys stored ``[.., S, head_dim]`` made a decode
step's score products much slower than its value products, and heads before positions beat
``[B, S, kv_heads, head_dim]`` (the figures: benchmarks/README.md, "Measurements behind choices in the code"). Both are written
with ``dynamic_update_slice`` at ``cache_index``, so a jitted decode loop can donate the cache
and update it in place. Without a cache the keys are the current tokens themselves; both paths
share ``attention_mask_3d`` and ``attend`` so prefill, decode and training compute the same
numbers.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from rlinf_jax import kernels
from rlinf_jax.policies.lm.config import LMConfig
from rlinf_jax.policies.lm.layers import Dense, RMSNorm, apply_rope

# Large and finite rather than -inf: a query whose keys are all masked (a pad row) then gets a
# uniform, finite softmax instead of NaNs that would leak into gradients.
_MASKED = -1e30


class KVCache(NamedTuple):
    """Keys ``[B, kv_heads, head_dim, S]`` and values ``[B, kv_heads, S, head_dim]`` of every
    layer: a tuple of per-layer arrays (an unrolled model's), or one array each with a leading
    layer axis, ``[L, B, ...]`` (a scanned model's, `policies.lm.layout`). ``keys[i]`` is layer
    ``i``'s either way."""

    keys: tuple[jax.Array, ...] | jax.Array
    values: tuple[jax.Array, ...] | jax.Array

    @property
    def max_len(self) -> int:
        return self.values[0].shape[2]

    @property
    def stacked(self) -> bool:
        return not isinstance(self.keys, tuple)

    @classmethod
    def zeros(cls, config: LMConfig, batch: int, max_len: int, dtype, stacked: bool = False) -> KVCache:
        B, K, S, D = batch, config.num_kv_heads, max_len, config.head_dim
        if stacked:
            L = config.num_layers
            return cls(keys=jnp.zeros((L, B, K, D, S), dtype), values=jnp.zeros((L, B, K, S, D), dtype))
        return cls(
            keys=tuple(jnp.zeros((B, K, D, S), dtype) for _ in range(config.num_layers)),
            values=tuple(jnp.zeros((B, K, S, D), dtype) for _ in range(config.num_layers)),
        )

    def map_rows(self, fn) -> KVCache:
        """Every layer's arrays passed through ``fn``, which acts on the leading (batch) axis
        alone (mapped over the layer axis of a stacked cache)."""
        if self.stacked:
            return KVCache(jax.vmap(fn)(self.keys), jax.vmap(fn)(self.values))
        return KVCache(tuple(map(fn, self.keys)), tuple(map(fn, self.values)))

    def extend(self, extra: int) -> KVCache:
        """``extra`` empty slots appended after the last one."""

        def pad(x, axis):
            widths = [(0, 0)] * x.ndim
            widths[axis] = (0, extra)
            return jnp.pad(x, widths)

        if self.stacked:
            return KVCache(pad(self.keys, -1), pad(self.values, -2))
        return KVCache(tuple(pad(k, -1) for k in self.keys), tuple(pad(v, -2) for v in self.values))


def attention_mask_3d(key_valid: jax.Array, query_slots: jax.Array) -> jax.Array:
    """``[B, T, S]`` booleans: query ``t`` (at key slot ``query_slots[t]``) may see key ``s``.

    A key is visible when it holds a real token (``key_valid [B, S]``) and is not in the
    query's future (causal).
    """
    key_slots = jnp.arange(key_valid.shape[1])
    causal = key_slots[None, :] <= query_slots[:, None]  # [T, S]
    return key_valid.astype(bool)[:, None, :] & causal[None]


def products(a: jax.Array, b: jax.Array, matmul: str = "xla") -> jax.Array:
    """``a @ b`` for each (batch, KV head) pair, ``[B, K, M, N]``, accumulated in float32: the
    attention's two matrix products, through the backend ``matmul`` names."""
    return kernels.matmul(a, b, matmul)


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, matmul: str = "xla") -> jax.Array:
    """Softmax attention of grouped queries.

    q ``[B, T, K, G, D]`` (query head ``h = k * G + g``, Hugging Face's ``repeat_kv`` order),
    k ``[B, K, D, S]``, v ``[B, K, S, D]`` (the cache's layout), mask ``[B, T, S]``; returns
    ``[B, T, K, G, D]``. Scores and the softmax run in float32 whatever the compute dtype.

    The G query heads sharing a KV head and the T query positions are folded into one row
    axis, so each (batch, KV head) pair is a single ``[G*T, D] x [D, S]`` matmul and the
    softmax reduces over the minor axis. For a decode step (T = 1) every reshape here is
    free. On XLA CPU both a decode step's attention and its training backward ran several
    times faster this way than with T as its own axis (benchmarks/README.md, "Measurements behind choices in the code").
    """
    B, T, K, G, D = q.shape
    S = k.shape[3]
    queries = q.transpose(0, 2, 3, 1, 4).reshape(B, K, G * T, D)
    scores = products(queries, k, matmul) * D**-0.5
    visible = jnp.broadcast_to(mask[:, None, None], (B, 1, G, T, S)).reshape(B, 1, G * T, S)
    scores = jnp.where(visible, scores, _MASKED)
    # Softmax normalised after the product with the values: the division then runs over
    # [.., G*T, D] numbers instead of [.., G*T, S], and XLA CPU no longer writes out the
    # broadcast denominator (a training step 1-3% faster). The max is a shift the result
    # does not depend on, so no gradient goes through it.
    shift = jax.lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True))
    weights = jnp.exp(scores - shift)
    out = products(weights.astype(v.dtype), v, matmul)
    out = (out / jnp.sum(weights, axis=-1, keepdims=True)).astype(v.dtype)
    return out.reshape(B, K, G, T, D).transpose(0, 3, 1, 2, 4)


class Attention(nnx.Module):
    def __init__(self, config: LMConfig, *, dtype, param_dtype, rngs: nnx.Rngs, matmul: str = "xla"):
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.matmul = matmul
        kw = {"dtype": dtype, "param_dtype": param_dtype, "rngs": rngs, "matmul": matmul}
        q_size, kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        self.q_proj = Dense(c.hidden_size, q_size, ("embed", "q_heads"), use_bias=c.attention_bias, **kw)
        self.k_proj = Dense(c.hidden_size, kv_size, ("embed", "kv_heads"), use_bias=c.attention_bias, **kw)
        self.v_proj = Dense(c.hidden_size, kv_size, ("embed", "kv_heads"), use_bias=c.attention_bias, **kw)
        self.o_proj = Dense(q_size, c.hidden_size, ("q_heads", "embed"), use_bias=c.o_proj_bias, **kw)
        if c.qk_norm:
            norm = {"eps": c.rms_norm_eps, "dtype": dtype, "param_dtype": param_dtype, "rngs": rngs}
            self.q_norm = RMSNorm(c.head_dim, **norm)
            self.k_norm = RMSNorm(c.head_dim, **norm)
        else:
            self.q_norm = self.k_norm = None

    def __call__(self, x, batch, length, rope, mask, kv=None, cache_index=None, query_cols=None, layer=None):
        """x ``[B*T, embed]`` -> ``([B*Q, embed], (keys, values) or None)``.

        With ``kv`` (this layer's cached keys / values) the new keys are written at slot
        ``cache_index`` and the queries attend over the whole cache. With ``layer``, ``kv`` is
        every layer's cache stacked (``[L, ...]``, a scanned model's): the new keys and values
        are written into layer ``layer`` of it, the stack is returned, and that layer is
        attended over.

        ``query_cols = (start, Q)`` (no cache): keys and values come from all ``T`` columns,
        queries only from columns ``start .. start + Q - 1`` (``Q = T`` without it). A last
        layer whose output is read at a few columns skips the rest of its queries.
        """
        B, T = batch, length
        K, G, D = self.num_kv_heads, self.num_heads // self.num_kv_heads, self.head_dim
        cos, sin = rope
        xq, cq, sq, Q = x, cos, sin, T
        if query_cols is not None:
            start, Q = query_cols
            xq = x.reshape(B, T, -1)[:, start : start + Q].reshape(B * Q, -1)
            cq, sq = cos[:, start : start + Q], sin[:, start : start + Q]
            mask = mask[:, start : start + Q]
        q = self.q_proj(xq).reshape(B, Q, K * G, D)
        k = self.k_proj(x).reshape(B, T, K, D)
        v = self.v_proj(x).reshape(B, T, K, D)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cq, sq), apply_rope(k, cos, sin)
        k, v = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)  # [B, K, D, T], [B, K, T, D]
        new_kv = None
        if kv is not None and layer is not None:
            # Only the new columns are written into the stack (a decode step writes one
            # column a layer, in place), then the layer is read back to attend over.
            keys, values = kv
            keys = jax.lax.dynamic_update_slice(keys, k[None].astype(keys.dtype), (layer, 0, 0, 0, cache_index))
            values = jax.lax.dynamic_update_slice(values, v[None].astype(values.dtype), (layer, 0, 0, cache_index, 0))
            k = jax.lax.dynamic_index_in_dim(keys, layer, keepdims=False)
            v = jax.lax.dynamic_index_in_dim(values, layer, keepdims=False)
            new_kv = (keys, values)
        elif kv is not None:
            cached_k, cached_v = kv
            k = jax.lax.dynamic_update_slice(cached_k, k.astype(cached_k.dtype), (0, 0, 0, cache_index))
            v = jax.lax.dynamic_update_slice(cached_v, v.astype(cached_v.dtype), (0, 0, cache_index, 0))
            new_kv = (k, v)
        out = attend(q.reshape(B, Q, K, G, D), k.astype(q.dtype), v.astype(q.dtype), mask, self.matmul)
        return self.o_proj(out.reshape(B * Q, K * G * D)), new_kv
