"""PaliGemma: a SigLIP vision tower, one linear projector and a Gemma decoder; pi0's prefix.

Images become ``num_patches`` soft tokens each, placed where the prompt holds the image
token (``image_token_id``), in order; everything else is Gemma's scaled token embedding. The
image features are not scaled: transformers keeps Gemma's ``sqrt(hidden)`` inside the
embedding lookup, so ``inputs_embeds`` (and image tokens among them) go in as they are.

Attention: the prefix (``token_type_ids == 0``: image and prompt) is bidirectional, the
suffix (``token_type_ids == 1``) causal, as transformers' PaliGemma builds it; without
``token_type_ids`` the whole sequence is causal. Positions are 1-based counts of real tokens
(transformers numbers PaliGemma positions from 1; RoPE only sees differences, so any offset
gives the same numbers).

Images are ``[B, cameras, H, W, C]`` (channels last, normalised as the checkpoint expects);
``camera_mask [B, cameras]`` marks cameras that are present. As in transformers' PI0, the
k-th run of image tokens in a row takes the k-th *present* camera of that row.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm.config import LMConfig
from rlinf_jax.policies.lm.layers import Dense
from rlinf_jax.policies.lm.model import CausalLM
from rlinf_jax.policies.vla.vit import ViT, ViTConfig

# What transformers' PaliGemmaConfig assumes for keys a config.json leaves out (files written
# by transformers 4 drop values equal to these).
_VISION_DEFAULTS = {
    "model_type": "siglip_vision_model",
    "hidden_size": 1152,
    "intermediate_size": 4096,
    "patch_size": 14,
    "image_size": 224,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "vision_use_head": False,
}
_TEXT_DEFAULTS = {
    "model_type": "gemma",
    "hidden_size": 2048,
    "num_hidden_layers": 18,
    "intermediate_size": 16384,
    "num_attention_heads": 8,
    "num_key_value_heads": 1,
    "vocab_size": 257152,
}


@dataclasses.dataclass(frozen=True)
class PaliGemmaConfig:
    vision: ViTConfig
    text: LMConfig
    image_token_id: int = 256000

    def __post_init__(self):
        if self.text.model_type != "gemma":
            raise BadInput(
                f"PaliGemma's text model must be gemma, not {self.text.model_type!r}"
            )
        if self.vision.attention_pool or self.vision.class_token:
            raise BadInput(
                "PaliGemma's vision tower is a SigLIP without pooling head (vision_use_head=false)"
            )

    @property
    def tokens_per_image(self) -> int:
        return self.vision.num_patches

    @classmethod
    def from_hf_config(cls, hf: dict) -> PaliGemmaConfig:
        """Read a ``PaliGemmaForConditionalGeneration`` config.json dict (also pi0's
        ``vlm_config``)."""
        if hf.get("model_type") != "paligemma":
            raise BadInput(
                f"config.json model_type={hf.get('model_type')!r} is not 'paligemma'"
            )
        vision = {**_VISION_DEFAULTS, **hf.get("vision_config", {})}
        text = {**_TEXT_DEFAULTS, **hf.get("text_config", {})}
        projection = int(
            hf.get("projection_dim", vision.get("projection_dim", text["hidden_size"]))
        )
        if projection != int(text["hidden_size"]):
            raise BadInput(
                f"config.json projection_dim={projection} differs from the text hidden_size={text['hidden_size']}; "
                "the projector must map image features to the text width"
            )
        token = hf.get("image_token_id", hf.get("image_token_index", 256000))
        return cls(
            ViTConfig.from_hf_config(vision), LMConfig.from_hf_config(text), int(token)
        )


class PaliGemma(nnx.Module):
    def __init__(
        self,
        config: PaliGemmaConfig,
        *,
        dtype=jnp.float32,
        param_dtype=None,
        rngs: nnx.Rngs,
        scan_layers: bool = False,
        remat: str = "none",
    ):
        param_dtype = param_dtype or dtype
        kw = {"dtype": dtype, "param_dtype": param_dtype, "rngs": rngs}
        self.config = config
        self.dtype = dtype
        # ``scan_layers`` / ``remat``: the tower's and the LM's blocks under lax.scan and a
        # rematerialisation policy (see `CausalLM`).
        layout = {"scan_layers": scan_layers, "remat": remat}
        self.vision_tower = ViT(config.vision, **layout, **kw)
        self.projector = Dense(
            config.vision.hidden_size,
            config.text.hidden_size,
            ("embed", None),
            use_bias=True,
            **kw,
        )
        self.language_model = CausalLM(config.text, **layout, **kw)

    def image_features(self, pixels: jax.Array) -> jax.Array:
        """``[N, H, W, C]`` images -> projected patch features ``[N, tokens_per_image, text hidden]``."""
        h = self.vision_tower(pixels)
        N, T, D = h.shape
        return self.projector(h.reshape(N * T, D)).reshape(N, T, -1)

    def embed_prefix(
        self,
        input_ids: jax.Array,
        pixels: jax.Array,
        camera_mask: jax.Array | None = None,
    ) -> jax.Array:
        """Token embeddings ``[B, T, D]`` with image features at the image-token slots.

        ``input_ids [B, T]``, ``pixels [B, cameras, H, W, C]``, ``camera_mask [B, cameras]``.
        """
        if pixels.ndim != 5:
            raise BadInput(
                f"pixels have shape {tuple(pixels.shape)}; expected [batch, cameras, H, W, C]"
            )
        B, C = pixels.shape[:2]
        feats = self.image_features(pixels.reshape(B * C, *pixels.shape[2:]))
        N, D = feats.shape[1], feats.shape[2]
        feats = feats.reshape(B, C * N, D)
        is_image = input_ids == self.config.image_token_id
        rank = jnp.cumsum(is_image, axis=1) - 1  # [B, T]: which image token of its row
        camera_rank, offset = rank // N, rank % N
        if camera_mask is None:
            camera = camera_rank
        else:
            present = camera_mask.astype(bool)
            slot = (
                jnp.cumsum(present, axis=1) - 1
            )  # [B, C]: rank among the present cameras
            match = (slot[:, None, :] == camera_rank[..., None]) & present[
                :, None, :
            ]  # [B, T, C]
            camera = jnp.argmax(match, axis=-1)
        index = jnp.clip(camera * N + offset, 0, C * N - 1)
        image = jnp.take_along_axis(feats, index[..., None], axis=1)
        # The image token may lie outside the vocabulary (pi0's does): look up 0 instead.
        text = self.language_model.embed(jnp.where(is_image, 0, input_ids))
        return jnp.where(is_image[..., None], image.astype(text.dtype), text)

    def __call__(
        self,
        input_ids,
        pixels,
        attention_mask=None,
        token_type_ids=None,
        camera_mask=None,
    ):
        """Float32 logits ``[B, T, vocab]`` (transformers' ``PaliGemmaForConditionalGeneration``)."""
        B, T = input_ids.shape
        valid = (
            jnp.ones((B, T), bool)
            if attention_mask is None
            else attention_mask.astype(bool)
        )
        causal = jnp.tril(jnp.ones((T, T), bool))[None]
        if token_type_ids is None:
            mask = jnp.broadcast_to(causal, (B, T, T))
        else:
            prefix = token_type_ids == 0
            mask = causal | (prefix[:, :, None] & prefix[:, None, :])
        positions = jnp.cumsum(
            valid, axis=1, dtype=jnp.int32
        )  # 1-based, as transformers
        lm = self.language_model
        hidden = lm.hidden_states(
            attention_mask=valid,
            positions=positions,
            inputs_embeds=self.embed_prefix(input_ids, pixels, camera_mask),
            mask=mask,
        )
        return lm.logits(hidden)
