"""GR00T-N1.5: an Eagle-2.5 vision-language backbone and a flow-matching DiT action head.

- **Backbone** (``EagleBackbone``): SigLIP reads each camera; its patch features go
  (optionally pixel-shuffled 2x2 into the channels) through the connector ``mlp1`` and
  replace the image-token slots of the prompt; the Qwen3 language model runs its first
  ``select_layer`` layers only (the rest are dropped, as GR00T drops them), causally over the
  prompt, and its final norm gives the features, optionally projected (``eagle_linear``).
- **Action head** (``FlowmatchingActionHead``): the features go through a LayerNorm
  (``vlln``) and a self-attention stack, and become what the DiT cross-attends to. The DiT's
  tokens are one state token (a per-embodiment MLP of the padded state), the learned
  ``future_tokens`` and one token per action of the noisy chunk (a per-embodiment encoder of
  the action and the discretised time, plus a learned position embedding). The per-embodiment
  decoder reads the action tokens' outputs as the velocity. The layers are `policies.vla.dit`'s.

**Flow convention.** GR00T's time runs the other way from pi0's: ``x = (1 - s) noise + s
actions`` with velocity ``actions - noise``, integrated from ``s = 0``, and the DiT sees
``floor(1000 s)``. `FlowModel` (sampling, the RL chains, the loss) uses pi0's ``x_t = t noise
+ (1 - t) actions`` with velocity ``noise - actions``, so ``outputs`` reads ``s = 1 - t`` and
returns the negated velocity: the same chains, the same loss. Denoising from ``t = 1``
in ``N`` Euler steps visits GR00T's ``s = k / N``.

**RL heads** (absent from torch checkpoints): the value head reads the mean of the processed
backbone features over the real prompt tokens, concatenated with the state token, a function
of the observation alone; the flow-noise std head reads the DiT's outputs at the action tokens.

Shapes: ``B`` batch, ``P`` prompt tokens, ``H`` = ``chunk_size`` (GR00T's ``action_horizon``),
``A`` = ``max_action_dim`` (its ``action_dim``), ``S`` = ``max_state_dim``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm.config import LMConfig
from rlinf_jax.policies.lm.layers import INIT_STD, Dense, param
from rlinf_jax.policies.lm.model import CausalLM
from rlinf_jax.policies.vla.dit import DiT, DiTConfig, SelfAttentionTransformer
from rlinf_jax.policies.vla.flow_model import FlowModel, MLPHead
from rlinf_jax.policies.vla.vit import LayerNorm, ViT, ViTConfig


class Observation(NamedTuple):
    """What the DiT reads of one observation, computed once per chunk: the processed backbone
    features ``[B, P, D_vl]`` (all of them, padding included, as GR00T attends), the prompt's
    real tokens ``mask [B, P]``, their mean ``pooled [B, D_vl]``, the state token
    ``[B, 1, D_in]`` and the embodiment ids ``[B]``."""

    features: jax.Array
    mask: jax.Array
    pooled: jax.Array
    state_token: jax.Array
    embodiment: jax.Array


@dataclasses.dataclass(frozen=True)
class EagleConfig:
    """Eagle-2.5-VL as GR00T builds it (``Eagle25VLConfig``)."""

    vision: ViTConfig
    text: LMConfig  # the language model as run: its first ``select_layer`` layers
    image_token_id: int
    vision_select_layer: int = -1  # -1: SigLIP's last hidden state (after its final norm)
    use_pixel_shuffle: bool = True
    downsample_ratio: float = 0.5
    mlp_connector_layers: int = 2

    def __post_init__(self):
        if self.mlp_connector_layers not in (1, 2):
            raise BadInput(f"mlp_connector_layers={self.mlp_connector_layers} is not 1 or 2")
        if self.use_pixel_shuffle and (self.downsample_ratio != 0.5 or self.vision.grid % 2):
            raise BadInput(f"pixel shuffle needs downsample_ratio 0.5 and an even patch grid "
                           f"(got {self.downsample_ratio}, {self.vision.grid})")

    @property
    def tokens_per_image(self) -> int:
        return self.vision.num_patches // 4 if self.use_pixel_shuffle else self.vision.num_patches

    @property
    def connector_in(self) -> int:
        return self.vision.hidden_size * (4 if self.use_pixel_shuffle else 1)

    @classmethod
    def from_dict(cls, hf: dict, select_layer: int) -> EagleConfig:
        """From an Eagle-2.5-VL ``config.json`` dict, keeping ``select_layer`` LM layers."""
        vision, text = hf.get("vision_config"), hf.get("text_config")
        if not isinstance(vision, dict) or not isinstance(text, dict):
            raise BadInput("the Eagle config lacks vision_config / text_config")
        arch = (text.get("architectures") or ["Qwen3ForCausalLM"])[0]
        kinds = {"Qwen3ForCausalLM": "qwen3", "Qwen2ForCausalLM": "qwen2", "LlamaForCausalLM": "llama"}
        if arch not in kinds:
            raise BadInput(f"the Eagle text_config architecture {arch!r} is not one of {', '.join(kinds)}")
        lm = LMConfig.from_hf_config({**text, "model_type": kinds[arch]})
        if not 0 < select_layer <= lm.num_layers:
            raise BadInput(f"backbone_cfg select_layer={select_layer} is not in 1..{lm.num_layers}")
        # Tied here whatever the checkpoint says: the output head is never used.
        lm = dataclasses.replace(lm, num_layers=select_layer, tie_word_embeddings=True)
        if "image_token_index" not in hf:
            raise BadInput("the Eagle config lacks image_token_index")
        size = hf.get("force_image_size") or vision.get("image_size")
        return cls(
            vision=ViTConfig.from_hf_config({**vision, "model_type": "siglip_vision_model", "image_size": size}),
            text=lm,
            image_token_id=int(hf["image_token_index"]),
            vision_select_layer=int(hf.get("select_layer", -1)),
            use_pixel_shuffle=bool(hf.get("use_pixel_shuffle", True)),
            downsample_ratio=float(hf.get("downsample_ratio", 0.5)),
            mlp_connector_layers=int(hf.get("mlp_connector_layers", 2)),
        )


@dataclasses.dataclass(frozen=True)
class Gr00tConfig:
    eagle: EagleConfig
    dit: DiTConfig
    vl_self_attention: DiTConfig
    project_to_dim: int | None = None  # eagle_linear's width; None: the LM's features as they are
    chunk_size: int = 16
    max_action_dim: int = 32
    max_state_dim: int = 64
    hidden_size: int = 1024  # the state encoder's / action decoder's hidden width
    input_embedding_dim: int = 1536  # the DiT's token width
    max_num_embodiments: int = 32
    num_target_vision_tokens: int = 32  # the learned future tokens
    add_pos_embed: bool = True
    max_seq_len: int = 1024
    use_vlln: bool = True
    num_timestep_buckets: int = 1000
    num_steps: int = 4
    # Training-time distribution of GR00T's s: (noise_s - Beta(alpha, beta)) / noise_s.
    noise_beta_alpha: float = 1.5
    noise_beta_beta: float = 1.0
    noise_s: float = 0.999
    # RL heads, absent from torch checkpoints (fresh when converted); () = no head.
    value_hidden: tuple[int, ...] = ()
    noise_hidden: tuple[int, ...] = ()
    noise_std_range: tuple[float, float] = (0.08, 0.16)

    def __post_init__(self):
        if self.dit.inner_dim != self.input_embedding_dim:
            raise BadInput(f"the DiT's width (heads x head_dim = {self.dit.inner_dim}) must be "
                           f"input_embedding_dim={self.input_embedding_dim}")
        if self.dit.output_dim != self.hidden_size:
            raise BadInput(f"the DiT's output_dim={self.dit.output_dim} must be hidden_size={self.hidden_size} "
                           f"(the action decoder's input)")
        if self.dit.cross_attention_dim != self.backbone_dim:
            raise BadInput(f"the DiT's cross_attention_dim={self.dit.cross_attention_dim} must be the backbone "
                           f"features' width {self.backbone_dim}")
        if self.use_vlln and self.vl_self_attention.inner_dim != self.backbone_dim:
            raise BadInput(f"vl_self_attention's width {self.vl_self_attention.inner_dim} must be the backbone "
                           f"features' width {self.backbone_dim}")
        if self.input_embedding_dim % 2:
            raise BadInput(f"input_embedding_dim={self.input_embedding_dim} must be even (sin/cos halves)")
        if self.add_pos_embed and self.chunk_size > self.max_seq_len:
            raise BadInput(f"action_horizon={self.chunk_size} exceeds max_seq_len={self.max_seq_len}")
        if self.chunk_size < 1 or self.num_steps < 1:
            raise BadInput(f"action_horizon={self.chunk_size} and num_inference_timesteps={self.num_steps} "
                           f"must be positive")
        lo, hi = self.noise_std_range
        if not 0 < lo <= hi:
            raise BadInput(f"noise_std_range={self.noise_std_range} must satisfy 0 < min <= max")

    @property
    def backbone_dim(self) -> int:
        return self.project_to_dim or self.eagle.text.hidden_size

    @classmethod
    def from_config(cls, hf: dict, eagle: dict, **rl) -> Gr00tConfig:
        """From a GR00T-N1.5 ``config.json`` dict (``backbone_cfg``, ``action_head_cfg``) and its
        Eagle backbone's config dict; ``rl`` sets the RL-head fields."""
        backbone, head = hf.get("backbone_cfg"), hf.get("action_head_cfg")
        if not isinstance(backbone, dict) or not isinstance(head, dict):
            raise BadInput("config.json lacks backbone_cfg / action_head_cfg (a GR00T-N1.5 config.json has both)")
        for key in ("diffusion_model_cfg", "action_dim", "action_horizon"):
            if head.get(key) is None:
                raise BadInput(f"config.json action_head_cfg lacks {key!r}")
        use_vlln = bool(head.get("use_vlln", True))
        if use_vlln and not isinstance(head.get("vl_self_attention_cfg"), dict):
            raise BadInput("config.json action_head_cfg has use_vlln but no vl_self_attention_cfg")
        vl = DiTConfig.from_dict(head.get("vl_self_attention_cfg") or {"num_layers": 0, "num_attention_heads": 1,
                                                                       "attention_head_dim": 2}, self_attention=True)
        fields = ("hidden_size", "input_embedding_dim", "max_state_dim", "max_num_embodiments",
                  "num_target_vision_tokens", "add_pos_embed", "max_seq_len", "num_timestep_buckets",
                  "noise_beta_alpha", "noise_beta_beta", "noise_s")
        return cls(
            eagle=EagleConfig.from_dict(eagle, int(backbone.get("select_layer", 12))),
            dit=DiTConfig.from_dict(head["diffusion_model_cfg"]),
            vl_self_attention=vl,
            project_to_dim=backbone.get("project_to_dim"),
            chunk_size=int(head["action_horizon"]),
            max_action_dim=int(head["action_dim"]),
            num_steps=int(head.get("num_inference_timesteps") or 4),
            use_vlln=use_vlln,
            **{k: head[k] for k in fields if k in head},
            **rl,
        )


def action_time_features(t: jax.Array, width: int) -> jax.Array:
    """GR00T's ``SinusoidalPositionalEncoding`` of the discretised time ``t [B]`` ->
    ``[B, width]``: sin then cos of ``t * exp(-i log(10000) / half)``."""
    half = width // 2
    freqs = np.exp(-np.arange(half, dtype=np.float32) * np.float32(np.float32(math.log(10000.0)) / half))
    angles = t.astype(jnp.float32)[:, None] * jnp.asarray(freqs.astype(np.float32))[None]
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


class CategoryLinear(nnx.Module):
    """``CategorySpecificLinear``: one ``[in, out]`` weight and bias per embodiment, chosen per row.

    Fresh weights are drawn with std ``1 / sqrt(in)``, where GR00T's torch code draws 0.02
    (converted checkpoints replace them either way): at 0.02 the noisy action reaches the
    DiT's tokens 10-20x fainter than the time features beside it, and a model trained from
    scratch learns slowly (a tiny GR00T's flow-matching clone: loss 0.45 after 1,500 steps,
    where fan-in scaled weights pass 0.37 within 250 steps and reach 0.07)."""

    def __init__(self, categories: int, in_features: int, out_features: int, *, dtype, param_dtype, rngs):
        self.dtype = dtype
        self.W = param(rngs, nnx.initializers.normal(in_features ** -0.5), (categories, in_features, out_features),
                       param_dtype, (None, "embed", None))
        self.b = param(rngs, nnx.initializers.zeros, (categories, out_features), param_dtype, (None, None))

    def __call__(self, x: jax.Array, category: jax.Array) -> jax.Array:
        """``x [B, T, in]``, ``category [B]`` -> ``[B, T, out]``."""
        W = jnp.take(self.W[...], category, axis=0).astype(self.dtype)
        b = jnp.take(self.b[...], category, axis=0).astype(self.dtype)
        return jnp.einsum("bti,bio->bto", x.astype(self.dtype), W) + b[:, None]


class CategoryMLP(nnx.Module):
    """``CategorySpecificMLP``: ``layer2(relu(layer1(x)))``, per embodiment."""

    def __init__(self, categories: int, sizes: tuple[int, int, int], **kw):
        self.layer1 = CategoryLinear(categories, sizes[0], sizes[1], **kw)
        self.layer2 = CategoryLinear(categories, sizes[1], sizes[2], **kw)

    def __call__(self, x, category):
        return self.layer2(jax.nn.relu(self.layer1(x, category)), category)


class ActionEncoder(nnx.Module):
    """``MultiEmbodimentActionEncoder``: ``W3(swish(W2([W1(a), sinusoid(t)])))``."""

    def __init__(self, categories: int, action_dim: int, width: int, **kw):
        self.width = width
        self.W1 = CategoryLinear(categories, action_dim, width, **kw)
        self.W2 = CategoryLinear(categories, 2 * width, width, **kw)
        self.W3 = CategoryLinear(categories, width, width, **kw)

    def __call__(self, actions, t, category):
        """``actions [B, H, A]``, discretised time ``t [B]`` -> ``[B, H, width]``."""
        a = self.W1(actions, category)
        tau = jnp.broadcast_to(action_time_features(t, self.width)[:, None].astype(a.dtype), a.shape)
        return self.W3(jax.nn.silu(self.W2(jnp.concatenate([a, tau], axis=-1), category)), category)


class Gr00t(FlowModel):
    """GR00T-N1.5 (lerobot's / Isaac-GR00T's ``GR00TN15``) plus optional RL heads; see the
    module docstring. ``encode_observation`` runs the backbone once; `FlowModel`'s sampling,
    chains and loss take its `Observation` where pi0 takes its prefix (their ``state``
    argument is unused: the state is in the observation)."""

    def __init__(self, config: Gr00tConfig, *, dtype=jnp.float32, param_dtype=None, rngs: nnx.Rngs,
                 scan_layers: bool = False, remat: str = "none"):
        kw = {"dtype": dtype, "param_dtype": param_dtype or dtype, "rngs": rngs}
        self.config, self.dtype = config, dtype
        e = config.eagle
        layout = {"scan_layers": scan_layers, "remat": remat}
        self.vision_tower = ViT(e.vision, **layout, **kw)
        D_text = e.text.hidden_size
        self.connector_norm = LayerNorm(e.connector_in, eps=1e-5, **kw) if e.mlp_connector_layers == 2 else None
        self.connector_1 = Dense(e.connector_in, D_text, ("embed", None), use_bias=True, **kw)
        self.connector_2 = Dense(D_text, D_text, (None, "embed"), use_bias=True, **kw) \
            if e.mlp_connector_layers == 2 else None
        self.language_model = CausalLM(e.text, **layout, **kw)
        self.eagle_linear = Dense(D_text, config.project_to_dim, ("embed", None), use_bias=True, **kw) \
            if config.project_to_dim else None

        Dvl, Din, W, K = config.backbone_dim, config.input_embedding_dim, config.hidden_size, config.max_num_embodiments
        self.vlln = LayerNorm(Dvl, eps=1e-5, **kw) if config.use_vlln else None
        self.vl_self_attention = SelfAttentionTransformer(config.vl_self_attention, **kw) if config.use_vlln else None
        self.state_encoder = CategoryMLP(K, (config.max_state_dim, W, Din), **kw)
        self.action_encoder = ActionEncoder(K, config.max_action_dim, Din, **kw)
        self.action_decoder = CategoryMLP(K, (W, W, config.max_action_dim), **kw)
        self.future_tokens = param(rngs, nnx.initializers.normal(INIT_STD), (config.num_target_vision_tokens, Din),
                                   kw["param_dtype"], (None, "embed"))
        self.position_embedding = param(rngs, nnx.initializers.normal(INIT_STD), (config.max_seq_len, Din),
                                        kw["param_dtype"], (None, "embed")) if config.add_pos_embed else None
        self.dit = DiT(config.dit, **kw)
        value, noise = config.value_hidden, config.noise_hidden
        self.value_head = MLPHead((Dvl + Din, *value, 1), jax.nn.gelu, **kw) if value else None
        self.noise_head = MLPHead((config.dit.output_dim, *noise, config.max_action_dim), jnp.tanh, **kw) \
            if noise else None

    # -- the backbone --------------------------------------------------------------------

    def image_features(self, pixels: jax.Array) -> jax.Array:
        """``[N, H, W, C]`` images in [-1, 1] -> connector outputs ``[N, tokens_per_image, D_text]``."""
        e = self.config.eagle
        if e.vision_select_layer == -1:
            h = self.vision_tower(pixels)
        else:
            h = self.vision_tower.hidden_states(pixels)[e.vision_select_layer]
        N, T, C = h.shape
        if e.use_pixel_shuffle:
            g = e.vision.grid
            # Eagle's pixel_shuffle at ratio 0.5, step by step: 2 columns into the channels,
            # transpose, 2 rows into the channels, transpose back.
            h = h.reshape(N, g, g // 2, 2 * C).transpose(0, 2, 1, 3)
            h = h.reshape(N, g // 2, g // 2, 4 * C).transpose(0, 2, 1, 3).reshape(N, -1, 4 * C)
        flat = h.reshape(-1, h.shape[-1])
        if self.connector_norm is not None:
            flat = self.connector_norm(flat)
        flat = self.connector_1(flat)
        if self.connector_2 is not None:
            flat = self.connector_2(jax.nn.gelu(flat, approximate=False))
        return flat.reshape(N, -1, flat.shape[-1])

    def backbone(self, input_ids, pixels, attention_mask) -> jax.Array:
        """Eagle's layer-``select_layer`` features ``[B, P, D_vl]`` (after the LM's final norm and
        ``eagle_linear``): ``input_ids / attention_mask [B, P]``, ``pixels [B, cameras, H, W, C]``;
        the image-token slots take the cameras' tokens in order."""
        if pixels.ndim != 5:
            raise BadInput(f"pixels have shape {tuple(pixels.shape)}; expected [batch, cameras, H, W, C]")
        B, P = input_ids.shape
        feats = self.image_features(pixels.reshape(-1, *pixels.shape[2:]))
        feats = feats.reshape(B, -1, feats.shape[-1])
        is_image = input_ids == self.config.eagle.image_token_id
        index = jnp.clip(jnp.cumsum(is_image, axis=1) - 1, 0, feats.shape[1] - 1)
        image = jnp.take_along_axis(feats, index[..., None], axis=1)
        lm = self.language_model
        text = lm.embed(jnp.where(is_image, 0, input_ids))
        embeds = jnp.where(is_image[..., None], image.astype(text.dtype), text)
        # Causal, positions 0..P-1 whatever the padding (transformers' default without position_ids).
        positions = jnp.broadcast_to(jnp.arange(P, dtype=jnp.int32), (B, P))
        hidden = lm.hidden_states(attention_mask=attention_mask, positions=positions, inputs_embeds=embeds)
        if self.eagle_linear is not None:
            hidden = self.eagle_linear(hidden.reshape(B * P, -1)).reshape(B, P, -1)
        return hidden

    def encode_observation(self, input_ids, pixels, attention_mask, state, embodiment) -> Observation:
        """Run the backbone and the feature stack once: ``state [B, S]`` (zero-padded to
        ``max_state_dim``), ``embodiment [B]`` int ids."""
        c = self.config
        B = input_ids.shape[0]
        embodiment = jnp.broadcast_to(jnp.asarray(embodiment, jnp.int32), (B,))
        feats = self.backbone(input_ids, pixels, attention_mask)
        if self.vlln is not None:
            feats = self.vl_self_attention(self.vlln(feats))
        if state.shape[-1] > c.max_state_dim:
            raise BadInput(f"state has {state.shape[-1]} dimensions; this GR00T reads at most {c.max_state_dim}")
        state = jnp.pad(state.astype(jnp.float32), ((0, 0), (0, c.max_state_dim - state.shape[-1])))
        state_token = self.state_encoder(state[:, None], embodiment)
        weights = attention_mask.astype(jnp.float32)[..., None]
        pooled = jnp.sum(feats.astype(jnp.float32) * weights, 1) / jnp.maximum(jnp.sum(weights, 1), 1.0)
        return Observation(feats, attention_mask.astype(bool), pooled, state_token, embodiment)

    # -- the action head -----------------------------------------------------------------

    def discretize(self, s: jax.Array) -> jax.Array:
        """GR00T's ``floor(buckets * s)``; the 1e-4 keeps ``s = k / N`` computed as ``1 - t``
        in float32 from landing one bucket low."""
        return jnp.floor(s.astype(jnp.float32) * self.config.num_timestep_buckets + 1e-4)

    def dit_outputs(self, obs: Observation, x_t: jax.Array, t: jax.Array) -> jax.Array:
        """The DiT's outputs at the action tokens ``[B, H, output_dim]``, at pi0's ``t [B]``."""
        c = self.config
        B, H, _ = x_t.shape
        step = self.discretize(1.0 - t)
        actions = self.action_encoder(x_t.astype(jnp.float32), step, obs.embodiment)
        if self.position_embedding is not None:
            actions = actions + self.position_embedding[...][:H].astype(actions.dtype)[None]
        future = jnp.broadcast_to(self.future_tokens[...].astype(actions.dtype)[None],
                                  (B, c.num_target_vision_tokens, actions.shape[-1]))
        tokens = jnp.concatenate([obs.state_token.astype(actions.dtype), future, actions], axis=1)
        return self.dit(tokens, obs.features, step)[:, -H:]

    def outputs(self, prefix: Observation, state, x_t, t):
        """(velocity in pi0's convention ``[B, H, A]``, noise std or None, value ``[B]``)."""
        del state  # in the observation
        out = self.dit_outputs(prefix, x_t, t)
        v = -self.action_decoder(out, prefix.embodiment).astype(jnp.float32)
        return v, self.noise_std(out), self.value_of(
            jnp.concatenate([prefix.pooled, prefix.state_token[:, 0].astype(jnp.float32)], axis=-1))

    def training_times(self, key, n: int) -> jax.Array:
        """GR00T's training times in pi0's convention: ``t = 1 - s`` for its ``s = (noise_s -
        Beta(alpha, beta)) / noise_s``."""
        c = self.config
        b = jax.random.beta(key, c.noise_beta_alpha, c.noise_beta_beta, (n,))
        return 1.0 - (c.noise_s - b) / c.noise_s

    def gr00t_velocity(self, obs: Observation, x: jax.Array, s: jax.Array) -> jax.Array:
        """GR00T's own velocity ``actions - noise`` at its time ``s [B]`` (for parity checks)."""
        return -self.velocity(obs, None, x, 1.0 - s)
