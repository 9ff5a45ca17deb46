"""GR00T-N1.5's action-head transformers: the diffusion transformer (DiT) that denoises the
state / future / action tokens with cross-attention to the vision-language features, and the
plain self-attention stack those features go through first.

The blocks are diffusers' ``BasicTransformerBlock`` as GR00T configures it, numerically:

- **DiT block**: ``h + attn(ada_norm(h, temb) [+ pe])``, then ``h + ff(norm(h))``. The
  adaptive LayerNorm has no weights of its own: ``scale, shift = linear(silu(temb))``, and
  ``norm(x) * (1 + scale) + shift``. ``attn`` attends over the backbone features
  (cross-attention) in even blocks, and over the tokens themselves in odd blocks when
  ``interleave_self_attention`` is set. The feed-forward is ``gelu_tanh(proj(x)) @ out``
  at 4x width. No attention mask: GR00T attends over every backbone token, padding included.
- **Timestep encoder**: the discretised flow time (0..999) through diffusers' ``Timesteps``
  (256 channels, cos before sin, frequencies ``10000^(-i / 127)``) and ``linear_2(silu(linear_1))``.
- **Output**: ``shift, scale = proj_out_1(silu(temb))`` (shift first, unlike the blocks),
  ``proj_out_2(norm(h) * (1 + scale) + shift)``.
- **Self-attention stack** (``vl_self_attention``): the same block with affine LayerNorms and
  no time, no cross-attention.

``pe`` is diffusers' fixed sinusoidal position table, added to the normalised tokens before
attention when ``positional_embeddings="sinusoidal"``. Activations are ``[B, T, D]``.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm.layers import Dense
from rlinf_jax.policies.vla.vit import LayerNorm, attend

TIME_CHANNELS = 256  # diffusers' Timesteps(num_channels=256) in GR00T's TimestepEncoder


@dataclasses.dataclass(frozen=True)
class DiTConfig:
    """A ``DiT`` / ``SelfAttentionTransformer`` config (diffusers' names)."""

    num_layers: int
    num_attention_heads: int
    attention_head_dim: int
    output_dim: int = 0  # DiT only
    cross_attention_dim: int | None = None  # DiT only: the backbone features' width
    interleave_self_attention: bool = False
    positional_embeddings: str | None = "sinusoidal"
    max_num_positional_embeddings: int = 512
    attention_bias: bool = True
    norm_eps: float = 1e-5
    norm_elementwise_affine: bool = False  # DiT's norm3; the self-attention stack's are affine

    def __post_init__(self):
        if self.positional_embeddings not in (None, "sinusoidal"):
            raise BadInput(f"positional_embeddings={self.positional_embeddings!r} is not None or 'sinusoidal'")
        if self.inner_dim % 2:
            raise BadInput(f"the transformer's width {self.inner_dim} must be even (sinusoidal tables)")

    @property
    def inner_dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    @classmethod
    def from_dict(cls, cfg: dict, *, self_attention: bool = False) -> DiTConfig:
        """From GR00T's ``diffusion_model_cfg`` / ``vl_self_attention_cfg`` dicts; keys it does
        not read (dropout, compute dtype, ...) are ignored."""
        for key in ("num_layers", "num_attention_heads", "attention_head_dim"):
            if key not in cfg:
                raise BadInput(f"the action head's transformer config lacks {key!r}")
        if cfg.get("norm_type", "ada_norm") != "ada_norm" and not self_attention:
            raise BadInput(f"diffusion_model_cfg norm_type={cfg['norm_type']!r}: only 'ada_norm' is supported")
        act = cfg.get("activation_fn", "gelu-approximate")
        if act != "gelu-approximate":
            raise BadInput(f"activation_fn={act!r}: only 'gelu-approximate' is supported")
        fields = {f.name for f in dataclasses.fields(cls)}
        picked = {k: v for k, v in cfg.items() if k in fields}
        if self_attention:
            # SelfAttentionTransformer's blocks: affine LayerNorms, diffusers' default eps.
            picked = {**picked, "norm_elementwise_affine": True, "norm_eps": 1e-5, "cross_attention_dim": None,
                      "interleave_self_attention": False}
        return cls(**picked)


def timestep_features(t: jax.Array, channels: int = TIME_CHANNELS) -> jax.Array:
    """diffusers' ``Timesteps(channels, flip_sin_to_cos=True, downscale_freq_shift=1)`` of
    ``t [B]`` -> ``[B, channels]`` float32: cos then sin of ``t * 10000^(-i / (half - 1))``."""
    half = channels // 2
    freqs = np.exp(-math.log(10000.0) * np.arange(half, dtype=np.float32) / (half - 1)).astype(np.float32)
    angles = t.astype(jnp.float32)[:, None] * jnp.asarray(freqs)[None]
    return jnp.concatenate([jnp.cos(angles), jnp.sin(angles)], axis=-1)


def position_table(length: int, width: int) -> np.ndarray:
    """diffusers' ``SinusoidalPositionalEmbedding`` table ``[length, width]``: sin in even
    channels, cos in odd, of ``pos * 10000^(-2i / width)``."""
    position = np.arange(length, dtype=np.float32)[:, None]
    div = np.exp(np.arange(0, width, 2, dtype=np.float32) * np.float32(-math.log(10000.0) / width))
    table = np.zeros((length, width), np.float32)
    table[:, 0::2] = np.sin(position * div)
    table[:, 1::2] = np.cos(position * div)
    return table


def normalize(x: jax.Array, eps: float) -> jax.Array:
    """LayerNorm without weights, in float32."""
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    return (x32 - mean) * jax.lax.rsqrt(var + eps)


class Attention(nnx.Module):
    """diffusers' ``Attention``: ``to_q`` on the queries, ``to_k`` / ``to_v`` on the keys'
    source (``cross_dim`` wide), ``to_out``; no mask."""

    def __init__(self, dim: int, heads: int, head_dim: int, cross_dim: int | None, bias: bool, **kw):
        inner = heads * head_dim
        self.heads, self.head_dim = heads, head_dim
        self.to_q = Dense(dim, inner, ("embed", "q_heads"), use_bias=bias, **kw)
        self.to_k = Dense(cross_dim or dim, inner, ("embed", "q_heads"), use_bias=bias, **kw)
        self.to_v = Dense(cross_dim or dim, inner, ("embed", "q_heads"), use_bias=bias, **kw)
        self.to_out = Dense(inner, dim, ("q_heads", "embed"), use_bias=True, **kw)

    def __call__(self, x: jax.Array, source: jax.Array) -> jax.Array:
        """``x [B, T, dim]`` attends over ``source [B, S, *]`` (``x`` itself for self-attention)."""
        B, T, _ = x.shape
        S = source.shape[1]
        H, Dh = self.heads, self.head_dim
        q = self.to_q(x.reshape(B * T, -1)).reshape(B, T, H, Dh)
        k = self.to_k(source.reshape(B * S, -1)).reshape(B, S, H, Dh)
        v = self.to_v(source.reshape(B * S, -1)).reshape(B, S, H, Dh)
        return self.to_out(attend(q, k, v).reshape(B * T, H * Dh)).reshape(B, T, -1)


class FeedForward(nnx.Module):
    """diffusers' ``FeedForward(activation_fn="gelu-approximate")``: ``out(gelu_tanh(proj(x)))``."""

    def __init__(self, dim: int, **kw):
        self.proj = Dense(dim, 4 * dim, ("embed", "mlp"), use_bias=True, **kw)
        self.out = Dense(4 * dim, dim, ("mlp", "embed"), use_bias=True, **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        B, T, D = x.shape
        return self.out(jax.nn.gelu(self.proj(x.reshape(B * T, D)), approximate=True)).reshape(B, T, D)


class Block(nnx.Module):
    """One ``BasicTransformerBlock`` (module docstring): adaptive norm when ``time_dim`` is
    given, else an affine LayerNorm; cross-attention over ``cross_dim``-wide features when
    given, else self-attention."""

    def __init__(self, config: DiTConfig, time_dim: int | None, cross_dim: int | None, **kw):
        D, eps = config.inner_dim, config.norm_eps
        self.eps = eps
        self.dtype = kw["dtype"]
        if time_dim is None:
            self.norm1 = LayerNorm(D, eps=eps, **kw)
            self.ada = None
        else:
            self.norm1 = None
            self.ada = Dense(time_dim, 2 * D, (None, "embed"), use_bias=True, **kw)
        self.attn = Attention(D, config.num_attention_heads, config.attention_head_dim, cross_dim,
                              config.attention_bias, **kw)
        self.norm3 = LayerNorm(D, eps=eps, **kw) if config.norm_elementwise_affine else None
        self.ff = FeedForward(D, **kw)
        self.positions = config.positional_embeddings == "sinusoidal"
        self.max_positions = config.max_num_positional_embeddings

    def __call__(self, h: jax.Array, source: jax.Array | None, temb: jax.Array | None) -> jax.Array:
        if self.ada is None:
            x = self.norm1(h)
        else:
            scale, shift = jnp.split(self.ada(jax.nn.silu(temb)).astype(jnp.float32), 2, axis=-1)
            x = (normalize(h, self.eps) * (1 + scale[:, None]) + shift[:, None]).astype(self.dtype)
        if self.positions:
            if x.shape[1] > self.max_positions:
                raise BadInput(f"{x.shape[1]} tokens exceed max_num_positional_embeddings={self.max_positions}")
            x = x + jnp.asarray(position_table(x.shape[1], x.shape[2])).astype(x.dtype)
        h = h + self.attn(x, x if source is None else source)
        x = self.norm3(h) if self.norm3 is not None else normalize(h, self.eps).astype(self.dtype)
        return h + self.ff(x)


class DiT(nnx.Module):
    """GR00T's ``DiT``: ``tokens [B, T, D]`` and ``features [B, S, cross_dim]`` at the
    discretised time ``t [B]`` -> ``[B, T, output_dim]`` (module docstring)."""

    def __init__(self, config: DiTConfig, *, dtype, param_dtype, rngs):
        kw = {"dtype": dtype, "param_dtype": param_dtype, "rngs": rngs}
        D = config.inner_dim
        self.config = config
        self.time_1 = Dense(TIME_CHANNELS, D, (None, "embed"), use_bias=True, **kw)
        self.time_2 = Dense(D, D, ("embed", None), use_bias=True, **kw)
        self.blocks = nnx.List([
            Block(config, D, None if self.self_attends(i) else config.cross_attention_dim, **kw)
            for i in range(config.num_layers)
        ])
        self.proj_out_1 = Dense(D, 2 * D, (None, "embed"), use_bias=True, **kw)
        self.proj_out_2 = Dense(D, config.output_dim, ("embed", None), use_bias=True, **kw)
        self.dtype = dtype

    def self_attends(self, index: int) -> bool:
        return self.config.interleave_self_attention and index % 2 == 1

    def time_embedding(self, t: jax.Array) -> jax.Array:
        """``temb [B, D]`` of the discretised time ``t [B]``."""
        return self.time_2(jax.nn.silu(self.time_1(timestep_features(t))))

    def __call__(self, tokens: jax.Array, features: jax.Array, t: jax.Array) -> jax.Array:
        temb = self.time_embedding(t)
        h = tokens.astype(self.dtype)
        for i, block in enumerate(self.blocks):
            h = block(h, None if self.self_attends(i) else features.astype(self.dtype), temb)
        shift, scale = jnp.split(self.proj_out_1(jax.nn.silu(temb)).astype(jnp.float32), 2, axis=-1)
        out = (normalize(h, 1e-6) * (1 + scale[:, None]) + shift[:, None]).astype(self.dtype)
        B, T, D = out.shape
        return self.proj_out_2(out.reshape(B * T, D)).reshape(B, T, -1)


class SelfAttentionTransformer(nnx.Module):
    """GR00T's ``SelfAttentionTransformer`` over ``[B, T, D]`` (module docstring)."""

    def __init__(self, config: DiTConfig, *, dtype, param_dtype, rngs):
        kw = {"dtype": dtype, "param_dtype": param_dtype, "rngs": rngs}
        self.blocks = nnx.List([Block(config, None, None, **kw) for _ in range(config.num_layers)])
        self.dtype = dtype

    def __call__(self, h: jax.Array) -> jax.Array:
        h = h.astype(self.dtype)
        for block in self.blocks:
            h = block(h, None, None)
        return h
