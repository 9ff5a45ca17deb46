"""Vision transformers of the VLA policies: SigLIP and DINOv2 (with or without registers).

One module covers both, because they differ only in switches: SigLIP has no prefix tokens,
tanh-approximate GELU and an optional attention-pool head; DINOv2 has a CLS token (plus
register tokens), per-channel layer scale on both residual branches and exact GELU. The
same switches also describe timm's ViTs (OpenVLA's checkpoints), whose DINOv2 gives the
CLS token no position embedding (``pos_embed_prefix=0``) where transformers' gives it one.

Images are ``[B, H, W, C]`` floats (channels last, already normalised the way the
checkpoint expects). The convolutional patch embedding is a matmul on flattened
``[P, P, C]`` patches (kernel stored ``[P, P, C, D]``, torch's conv weight transposed), and
like the LM the blocks run on 2-D ``[B*N, D]`` activations. Parameters carry logical axis
names (``embed``, ``mlp``, ``q_heads``, ``norm``; ``None`` for axes never sharded).

Outputs: ``model(pixels)`` is the last hidden state ``[B, N, D]`` after the final norm
(transformers' ``last_hidden_state``); ``hidden_states`` lists the embeddings and every
block's output (transformers' ``output_hidden_states``); ``patch_features`` is one block's
output without the prefix tokens, computing no block past it (OpenVLA reads the
second-to-last block); ``pooled`` is SigLIP's attention-pool output ``[B, D]``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm.layers import INIT_STD, Dense, param
from rlinf_jax.policies.lm.layout import stack_variables
from rlinf_jax.policies.lm.model import check_remat, checkpointed

SIGLIP_TYPES = ("siglip_vision_model", "siglip")
DINOV2_TYPES = ("dinov2_with_registers", "dinov2")
_GELU = {"gelu_pytorch_tanh": True, "gelu_new": True, "gelu_tanh": True, "gelu": False}


@dataclasses.dataclass(frozen=True)
class ViTConfig:
    """Architecture of a ViT. ``num_layers`` blocks are built; a model that only needs the
    features of an earlier block (OpenVLA) is built with fewer."""

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int
    patch_size: int
    num_channels: int = 3
    layer_norm_eps: float = 1e-6
    gelu_approximate: bool = False  # tanh GELU (SigLIP) instead of the exact erf form (DINOv2)
    class_token: bool = False
    num_register_tokens: int = 0
    # How many leading prefix tokens get a position embedding: transformers' DINOv2 gives the
    # CLS token one (1), timm's DINOv2-with-registers does not (0); registers never have one.
    pos_embed_prefix: int = 0
    layer_scale: bool = False
    layer_scale_init: float = 1.0
    qkv_bias: bool = True
    final_norm: bool = True
    attention_pool: bool = False  # SigLIP's multihead attention-pooling head

    def __post_init__(self):
        if self.hidden_size % self.num_heads:
            raise BadInput(f"hidden_size={self.hidden_size} is not a multiple of num_attention_heads={self.num_heads}")
        if self.image_size % self.patch_size:
            raise BadInput(f"image_size={self.image_size} is not a multiple of patch_size={self.patch_size}")
        if self.pos_embed_prefix > self.num_prefix_tokens - self.num_register_tokens:
            raise BadInput("pos_embed_prefix may count the CLS token only")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid * self.grid

    @property
    def num_prefix_tokens(self) -> int:
        return int(self.class_token) + self.num_register_tokens

    @property
    def num_positions(self) -> int:
        return self.num_patches + self.pos_embed_prefix

    @classmethod
    def from_hf_config(cls, hf: dict) -> ViTConfig:
        """Read a transformers ``config.json`` dict: ``SiglipVisionModel`` (or a full
        ``SiglipModel``, whose vision config is used), ``Dinov2WithRegistersModel`` or
        ``Dinov2Model``."""
        model_type = hf.get("model_type")
        if model_type == "siglip":
            hf = {**hf.get("vision_config", {}), "model_type": "siglip_vision_model"}
            model_type = "siglip_vision_model"
        if model_type not in SIGLIP_TYPES + DINOV2_TYPES:
            raise BadInput(
                f"config.json model_type={model_type!r} is not a supported vision tower; "
                f"supported: {', '.join(SIGLIP_TYPES + DINOV2_TYPES)}"
            )
        for key in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "image_size",
            "patch_size",
        ):
            if key not in hf:
                raise BadInput(f"config.json lacks {key!r}, which a {model_type} model needs")
        act = hf.get("hidden_act", "gelu_pytorch_tanh" if model_type in SIGLIP_TYPES else "gelu")
        if act not in _GELU:
            raise BadInput(f"config.json hidden_act={act!r} is not supported; use one of {', '.join(_GELU)}")
        image_size, patch_size = (
            _square(hf["image_size"], "image_size"),
            _square(hf["patch_size"], "patch_size"),
        )
        common = {
            "model_type": model_type,
            "hidden_size": int(hf["hidden_size"]),
            "num_layers": int(hf["num_hidden_layers"]),
            "num_heads": int(hf["num_attention_heads"]),
            "image_size": image_size,
            "patch_size": patch_size,
            "num_channels": int(hf.get("num_channels", 3)),
            "layer_norm_eps": float(hf.get("layer_norm_eps", 1e-6)),
            "gelu_approximate": _GELU[act],
        }
        if model_type in SIGLIP_TYPES:
            if "intermediate_size" not in hf:
                raise BadInput("config.json lacks 'intermediate_size', which a SigLIP vision model needs")
            return cls(
                **common,
                intermediate_size=int(hf["intermediate_size"]),
                attention_pool=bool(hf.get("vision_use_head", True)),
            )
        if hf.get("use_swiglu_ffn"):
            raise BadInput("config.json use_swiglu_ffn=true is not supported; only the GELU MLP is")
        return cls(
            **common,
            intermediate_size=int(int(hf["hidden_size"]) * hf.get("mlp_ratio", 4)),
            class_token=True,
            num_register_tokens=int(hf.get("num_register_tokens", 0)) if model_type == "dinov2_with_registers" else 0,
            pos_embed_prefix=1,
            layer_scale=True,
            layer_scale_init=float(hf.get("layerscale_value", 1.0)),
            qkv_bias=bool(hf.get("qkv_bias", True)),
        )


def _square(value, name: str) -> int:
    if isinstance(value, (list, tuple)):
        if len(value) != 2 or value[0] != value[1]:
            raise BadInput(f"config.json {name}={value} is not square; only square images and patches are supported")
        value = value[0]
    return int(value)


class LayerNorm(nnx.Module):
    """``(x - mean) / std * scale + bias`` over the last axis, computed in float32."""

    def __init__(self, size, *, eps, dtype, param_dtype, rngs):
        self.eps = eps
        self.dtype = dtype
        self.scale = param(rngs, nnx.initializers.ones, (size,), param_dtype, ("norm",))
        self.bias = param(rngs, nnx.initializers.zeros, (size,), param_dtype, ("norm",))

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        mean = jnp.mean(x32, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
        normed = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
        out = normed * self.scale[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)
        return out.astype(self.dtype)


def attend(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Bidirectional softmax attention, q ``[B, Tq, H, D]``, k / v ``[B, S, H, D]``; scores
    and softmax in float32."""
    scores = jnp.einsum("bqhd,bshd->bhqs", q, k, preferred_element_type=jnp.float32) * q.shape[-1] ** -0.5
    weights = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum(
        "bhqs,bshd->bqhd",
        weights.astype(v.dtype),
        v,
        preferred_element_type=jnp.float32,
    )
    return out.astype(v.dtype)


class Attention(nnx.Module):
    def __init__(self, config: ViTConfig, *, dtype, param_dtype, rngs):
        d = config.hidden_size
        kw = {"dtype": dtype, "param_dtype": param_dtype, "rngs": rngs}
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.q_proj = Dense(d, d, ("embed", "q_heads"), use_bias=config.qkv_bias, **kw)
        self.k_proj = Dense(d, d, ("embed", "q_heads"), use_bias=config.qkv_bias, **kw)
        self.v_proj = Dense(d, d, ("embed", "q_heads"), use_bias=config.qkv_bias, **kw)
        self.o_proj = Dense(d, d, ("q_heads", "embed"), use_bias=True, **kw)

    def __call__(self, queries: jax.Array, keys: jax.Array, batch: int) -> jax.Array:
        """``queries [B*Tq, D]`` attend to ``keys [B*S, D]`` (the same array for self-attention)."""
        H, Dh = self.num_heads, self.head_dim
        q = self.q_proj(queries).reshape(batch, -1, H, Dh)
        k = self.k_proj(keys).reshape(batch, -1, H, Dh)
        v = self.v_proj(keys).reshape(batch, -1, H, Dh)
        out = attend(q, k, v)
        return self.o_proj(out.reshape(-1, H * Dh))


class MLP(nnx.Module):
    def __init__(self, config: ViTConfig, *, dtype, param_dtype, rngs):
        kw = {
            "use_bias": True,
            "dtype": dtype,
            "param_dtype": param_dtype,
            "rngs": rngs,
        }
        self.approximate = config.gelu_approximate
        self.fc1 = Dense(config.hidden_size, config.intermediate_size, ("embed", "mlp"), **kw)
        self.fc2 = Dense(config.intermediate_size, config.hidden_size, ("mlp", "embed"), **kw)

    def __call__(self, x):
        return self.fc2(jax.nn.gelu(self.fc1(x), approximate=self.approximate))


class Block(nnx.Module):
    """Pre-LN block: ``h + ls1 * attn(norm1(h))``, then ``h + ls2 * mlp(norm2(h))`` (layer
    scales only in DINOv2)."""

    def __init__(self, config: ViTConfig, *, dtype, param_dtype, rngs):
        kw = {"dtype": dtype, "param_dtype": param_dtype, "rngs": rngs}
        d = config.hidden_size
        self.norm1 = LayerNorm(d, eps=config.layer_norm_eps, **kw)
        self.attn = Attention(config, **kw)
        self.norm2 = LayerNorm(d, eps=config.layer_norm_eps, **kw)
        self.mlp = MLP(config, **kw)
        if config.layer_scale:
            init = nnx.initializers.constant(config.layer_scale_init)
            self.ls1 = param(rngs, init, (d,), param_dtype, ("norm",))
            self.ls2 = param(rngs, init, (d,), param_dtype, ("norm",))
        else:
            self.ls1 = self.ls2 = None

    def __call__(self, h: jax.Array, batch: int) -> jax.Array:
        x = self.norm1(h)
        a = self.attn(x, x, batch)
        if self.ls1 is not None:
            a = a * self.ls1[...].astype(a.dtype)
        h = h + a
        m = self.mlp(self.norm2(h))
        if self.ls2 is not None:
            m = m * self.ls2[...].astype(m.dtype)
        return h + m


class AttentionPool(nnx.Module):
    """SigLIP's head: one learned probe attends over all tokens, then ``x + mlp(norm(x))``."""

    def __init__(self, config: ViTConfig, *, dtype, param_dtype, rngs):
        kw = {"dtype": dtype, "param_dtype": param_dtype, "rngs": rngs}
        d = config.hidden_size
        self.probe = param(
            rngs,
            nnx.initializers.normal(INIT_STD),
            (1, d),
            param_dtype,
            (None, "embed"),
        )
        self.attn = Attention(dataclasses.replace(config, qkv_bias=True), **kw)
        self.norm = LayerNorm(d, eps=config.layer_norm_eps, **kw)
        self.mlp = MLP(config, **kw)

    def __call__(self, h: jax.Array, batch: int) -> jax.Array:
        probe = jnp.broadcast_to(self.probe[...].astype(h.dtype), (batch, h.shape[-1]))
        x = self.attn(probe, h, batch)
        return x + self.mlp(self.norm(x))


class ViT(nnx.Module):
    """SigLIP / DINOv2 vision transformer; see the module docstring for the outputs."""

    def __init__(self, config: ViTConfig, *, dtype=jnp.float32, param_dtype=None, rngs: nnx.Rngs,
                 scan_layers: bool = False, remat: str = "none"):
        param_dtype = param_dtype or dtype
        check_remat(remat)
        self.config = config
        # As `CausalLM`'s: the blocks stacked on a leading layer axis and run under lax.scan,
        # so XLA compiles one block whatever the depth (the same seed, the same weights), and
        # each block under the rematerialisation policy ``remat``.
        self.scan_layers = bool(scan_layers)
        self.remat = remat
        self.dtype = dtype
        self.param_dtype = param_dtype
        c = config
        kw = {"dtype": dtype, "param_dtype": param_dtype, "rngs": rngs}
        P, C, D = c.patch_size, c.num_channels, c.hidden_size
        normal = nnx.initializers.normal(INIT_STD)
        self.patch_kernel = param(rngs, normal, (P, P, C, D), param_dtype, (None, None, None, "embed"))
        self.patch_bias = param(rngs, nnx.initializers.zeros, (D,), param_dtype, ("embed",))
        self.pos_embed = param(rngs, normal, (c.num_positions, D), param_dtype, (None, "embed"))
        self.cls_token = param(rngs, normal, (1, D), param_dtype, (None, "embed")) if c.class_token else None
        self.reg_tokens = (
            param(rngs, normal, (c.num_register_tokens, D), param_dtype, (None, "embed"))
            if c.num_register_tokens
            else None
        )
        blocks = [Block(c, **kw) for _ in range(c.num_layers)]
        if self.scan_layers:
            self.blocks = nnx.merge(nnx.graphdef(blocks[0]), stack_variables([nnx.state(b) for b in blocks]))
        else:
            self.blocks = nnx.List(blocks)
        self.final_norm = LayerNorm(D, eps=c.layer_norm_eps, **kw) if c.final_norm else None
        self.head = AttentionPool(c, **kw) if c.attention_pool else None

    def patch_embed(self, pixels: jax.Array) -> jax.Array:
        """Patch embeddings ``[B, num_patches, D]`` (row-major over the patch grid), before
        position embeddings and prefix tokens."""
        c = self.config
        if pixels.ndim != 4 or pixels.shape[1:] != (
            c.image_size,
            c.image_size,
            c.num_channels,
        ):
            raise BadInput(
                f"pixels have shape {tuple(pixels.shape)}; this ViT takes "
                f"[batch, {c.image_size}, {c.image_size}, {c.num_channels}] (channels last)"
            )
        B, G, P = pixels.shape[0], c.grid, c.patch_size
        patches = pixels.astype(self.dtype).reshape(B, G, P, G, P, c.num_channels).transpose(0, 1, 3, 2, 4, 5)
        kernel = self.patch_kernel[...].astype(self.dtype).reshape(P * P * c.num_channels, -1)
        out = jnp.dot(patches.reshape(B * G * G, -1), kernel) + self.patch_bias[...].astype(self.dtype)
        return out.reshape(B, G * G, -1)

    def embed(self, pixels: jax.Array) -> jax.Array:
        """Block input ``[B, prefix + num_patches, D]``: CLS, registers, then patches, with
        position embeddings added to the CLS token (when ``pos_embed_prefix``) and patches."""
        c = self.config
        x = self.patch_embed(pixels)
        B, D = x.shape[0], x.shape[-1]
        pos = self.pos_embed[...].astype(self.dtype)
        cls = None
        if self.cls_token is not None:
            cls = jnp.broadcast_to(self.cls_token[...].astype(self.dtype), (B, 1, D))
            if c.pos_embed_prefix:
                cls = cls + pos[:1]
        x = x + pos[c.pos_embed_prefix :]
        parts = [] if cls is None else [cls]
        if self.reg_tokens is not None:
            parts.append(
                jnp.broadcast_to(
                    self.reg_tokens[...].astype(self.dtype),
                    (B, c.num_register_tokens, D),
                )
            )
        return jnp.concatenate([*parts, x], axis=1) if parts else x

    def hidden_states(self, pixels: jax.Array, num_blocks: int | None = None) -> list[jax.Array]:
        """``[embeddings, block 0 output, ..., block num_blocks-1 output]``, each ``[B, N, D]``
        (no final norm); ``num_blocks`` defaults to all."""
        return self._run_blocks(pixels, num_blocks, keep_all=True)

    def last_hidden_state(self, pixels: jax.Array, num_blocks: int | None = None) -> jax.Array:
        """``hidden_states(pixels, num_blocks)[-1]``, keeping no other block's output."""
        return self._run_blocks(pixels, num_blocks, keep_all=False)[-1]

    def _run_blocks(self, pixels, num_blocks, keep_all: bool) -> list[jax.Array]:
        n = self.config.num_layers
        num_blocks = n if num_blocks is None else num_blocks
        if not 0 <= num_blocks <= n:
            raise BadInput(f"num_blocks={num_blocks} is outside 0..{n}")
        x = self.embed(pixels)
        B, N, D = x.shape
        h = x.reshape(B * N, D)
        if not self.scan_layers:
            outs = [x]
            for block in self.blocks[:num_blocks]:
                graphdef, state = nnx.split(block)
                h = checkpointed(lambda st, h, g=graphdef: nnx.merge(g, st)(h, B), self.remat)(state, h)
                outs.append(h.reshape(B, N, D))
            return outs if keep_all else [outs[-1]]
        if num_blocks == 0:
            return [x]
        graphdef, stacked = nnx.split(self.blocks)
        stacked = jax.tree.map(lambda v: v[:num_blocks], stacked)
        # A loop body's recomputation cannot merge with the forward pass it repeats.
        block = checkpointed(lambda st, h: nnx.merge(graphdef, st)(h, B), self.remat, prevent_cse=False)

        def step(h, state):
            h = block(state, h)
            return h, (h if keep_all else None)

        h, every = jax.lax.scan(step, h, stacked)
        if not keep_all:
            return [h.reshape(B, N, D)]
        return [x, *(every[i].reshape(B, N, D) for i in range(num_blocks))]

    def patch_features(self, pixels: jax.Array, layer: int = -2) -> jax.Array:
        """Output of block ``layer`` (Python indexing into the blocks; -2 is the second to
        last) without the prefix tokens, ``[B, num_patches, D]``; later blocks are not run."""
        n = self.config.num_layers
        index = layer + n if layer < 0 else layer
        if not 0 <= index < n:
            raise BadInput(f"layer={layer} does not name one of the {n} blocks")
        return self.last_hidden_state(pixels, index + 1)[:, self.config.num_prefix_tokens :]

    def __call__(self, pixels: jax.Array) -> jax.Array:
        """Last hidden state ``[B, N, D]``, after the final norm when the model has one."""
        h = self.last_hidden_state(pixels)
        return h if self.final_norm is None else self.final_norm(h)

    def pooled(self, pixels: jax.Array) -> jax.Array:
        """The attention-pool head's output ``[B, D]`` (SigLIP's ``pooler_output``)."""
        if self.head is None:
            raise BadInput("this ViT has no attention-pool head (vision_use_head=false)")
        h = self(pixels)
        B, N, D = h.shape
        return self.head(h.reshape(B * N, D), B)
