"""transformers' ``SiglipVisionModel`` / ``SiglipModel`` (vision tower) and
``Dinov2WithRegistersModel`` / ``Dinov2Model`` checkpoints -> ``policies.vla.vit.ViT``.

Key names follow what ``save_pretrained`` writes: SigLIP keys with or without the
``vision_model.`` prefix (transformers 4 wrote it, 5 does not), DINOv2 attention under its
saved names (``attention.attention.query``, ``attention.output.dense``) or transformers 5's
in-memory ones (``attention.q_proj``). Parameters are ours as ``ViT`` names them.
"""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
from flax import nnx

from rlinf_jax.policies.convert import keys, store
from rlinf_jax.policies.convert.keys import Row, Skip
from rlinf_jax.policies.lm.hf_checkpoint import (
    read_hf_config,
)
from rlinf_jax.policies.vla.vit import SIGLIP_TYPES, ViT, ViTConfig


def _block_mlp(src: str) -> tuple[Row, ...]:
    return (
        Row(f"{src}.mlp.fc1.weight", "blocks.{layer}.mlp.fc1.kernel", "T"),
        Row(f"{src}.mlp.fc1.bias", "blocks.{layer}.mlp.fc1.bias"),
        Row(f"{src}.mlp.fc2.weight", "blocks.{layer}.mlp.fc2.kernel", "T"),
        Row(f"{src}.mlp.fc2.bias", "blocks.{layer}.mlp.fc2.bias"),
    )


_SIGLIP = (
    Row("embeddings.patch_embedding.weight", "patch_kernel", "conv"),
    Row("embeddings.patch_embedding.bias", "patch_bias"),
    Row("embeddings.position_embedding.weight", "pos_embed"),
    Row("encoder.layers.{layer}.layer_norm1.weight", "blocks.{layer}.norm1.scale"),
    Row("encoder.layers.{layer}.layer_norm1.bias", "blocks.{layer}.norm1.bias"),
    Row(
        "encoder.layers.{layer}.self_attn.out_proj.weight",
        "blocks.{layer}.attn.o_proj.kernel",
        "T",
    ),
    Row(
        "encoder.layers.{layer}.self_attn.out_proj.bias",
        "blocks.{layer}.attn.o_proj.bias",
    ),
    Row(
        "encoder.layers.{layer}.self_attn.{proj}_proj.weight",
        "blocks.{layer}.attn.{proj}_proj.kernel",
        "T",
    ),
    Row(
        "encoder.layers.{layer}.self_attn.{proj}_proj.bias",
        "blocks.{layer}.attn.{proj}_proj.bias",
    ),
    Row("encoder.layers.{layer}.layer_norm2.weight", "blocks.{layer}.norm2.scale"),
    Row("encoder.layers.{layer}.layer_norm2.bias", "blocks.{layer}.norm2.bias"),
    *_block_mlp("encoder.layers.{layer}"),
    Row("post_layernorm.weight", "final_norm.scale"),
    Row("post_layernorm.bias", "final_norm.bias"),
    Row("head.probe", "head.probe", "flat"),
    Row(
        "head.attention.in_proj_weight",
        (
            "head.attn.q_proj.kernel",
            "head.attn.k_proj.kernel",
            "head.attn.v_proj.kernel",
        ),
        "T",
    ),
    Row(
        "head.attention.in_proj_bias",
        ("head.attn.q_proj.bias", "head.attn.k_proj.bias", "head.attn.v_proj.bias"),
    ),
    Row("head.attention.out_proj.weight", "head.attn.o_proj.kernel", "T"),
    Row("head.attention.out_proj.bias", "head.attn.o_proj.bias"),
    Row("head.layernorm.weight", "head.norm.scale"),
    Row("head.layernorm.bias", "head.norm.bias"),
    Row("head.mlp.fc1.weight", "head.mlp.fc1.kernel", "T"),
    Row("head.mlp.fc1.bias", "head.mlp.fc1.bias"),
    Row("head.mlp.fc2.weight", "head.mlp.fc2.kernel", "T"),
    Row("head.mlp.fc2.bias", "head.mlp.fc2.bias"),
)
SIGLIP_ROWS = _SIGLIP + keys.prefixed("vision_model.", _SIGLIP)
# A full SiglipModel checkpoint also holds the text tower and the contrastive logit scale.
SIGLIP_SKIPS = (
    Skip(r"text_model\..*", "SigLIP's text tower: only the vision tower is converted"),
    Skip(r"logit_(scale|bias)", "SigLIP's contrastive-loss scalars"),
)

_L = "encoder.layer.{layer}"
DINOV2_ROWS = (
    Row("embeddings.cls_token", "cls_token", "flat"),
    Row("embeddings.register_tokens", "reg_tokens", "flat"),
    Row("embeddings.position_embeddings", "pos_embed", "flat"),
    Row("embeddings.patch_embeddings.projection.weight", "patch_kernel", "conv"),
    Row("embeddings.patch_embeddings.projection.bias", "patch_bias"),
    Row(f"{_L}.norm1.weight", "blocks.{layer}.norm1.scale"),
    Row(f"{_L}.norm1.bias", "blocks.{layer}.norm1.bias"),
    *(
        Row(
            f"{_L}.attention.attention.{name}.{kind}",
            f"blocks.{{layer}}.attn.{ours}_proj.{'kernel' if kind == 'weight' else 'bias'}",
            "T" if kind == "weight" else "",
        )
        for name, ours in (("query", "q"), ("key", "k"), ("value", "v"))
        for kind in ("weight", "bias")
    ),
    Row(f"{_L}.attention.output.dense.weight", "blocks.{layer}.attn.o_proj.kernel", "T"),
    Row(f"{_L}.attention.output.dense.bias", "blocks.{layer}.attn.o_proj.bias"),
    Row(
        f"{_L}.attention.{{proj}}_proj.weight",
        "blocks.{layer}.attn.{proj}_proj.kernel",
        "T",
    ),
    Row(f"{_L}.attention.{{proj}}_proj.bias", "blocks.{layer}.attn.{proj}_proj.bias"),
    Row(f"{_L}.layer_scale1.lambda1", "blocks.{layer}.ls1"),
    Row(f"{_L}.norm2.weight", "blocks.{layer}.norm2.scale"),
    Row(f"{_L}.norm2.bias", "blocks.{layer}.norm2.bias"),
    *_block_mlp(_L),
    Row(f"{_L}.layer_scale2.lambda1", "blocks.{layer}.ls2"),
    Row("layernorm.weight", "final_norm.scale"),
    Row("layernorm.bias", "final_norm.bias"),
)
DINOV2_SKIPS = (Skip(r"embeddings\.mask_token", "used only by masked-image pretraining"),)


def key_map(config: ViTConfig) -> tuple[tuple[Row, ...], tuple[Skip, ...]]:
    """(rows, skips) for a transformers checkpoint of this architecture."""
    if config.model_type in SIGLIP_TYPES:
        return SIGLIP_ROWS, SIGLIP_SKIPS
    return DINOV2_ROWS, DINOV2_SKIPS


def build(hf: dict, dtype=jnp.float32, param_dtype=None) -> ViT:
    return ViT(
        ViTConfig.from_hf_config(hf),
        dtype=dtype,
        param_dtype=param_dtype,
        rngs=nnx.Rngs(0),
    )


def from_pretrained(path, dtype=jnp.float32, param_dtype=None) -> ViT:
    """A ``ViT`` from a local transformers directory (config.json + safetensors)."""
    hf = read_hf_config(path)
    config = ViTConfig.from_hf_config(hf)
    return store.model_from_checkpoint(path, build, hf, key_map(config), f"{config.model_type} vision model", dtype, param_dtype)


def convert(src, out_dir, dtype="auto") -> Path:
    """transformers vision-tower directory ``src`` -> converted directory ``out_dir``."""
    return store.convert_directory(from_pretrained, src, out_dir, dtype)


def load(path, dtype=None) -> ViT:
    """The ``ViT`` written by ``convert``."""
    return store.load_converted(path, build, dtype)
