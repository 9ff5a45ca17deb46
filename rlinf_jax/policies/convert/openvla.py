"""OpenVLA checkpoints (``OpenVLAForActionPrediction``, model_type ``openvla``) -> ``OpenVLA``.

OpenVLA saves its timm towers as they are in memory, under ``vision_backbone.featurizer.``
(DINOv2) and ``vision_backbone.fused_featurizer.`` (SigLIP): fused ``attn.qkv`` (rows q, k,
v stacked on the output axis), ``attn.proj``, ``ls1/ls2.scale_factor`` (timm's
``LayerScale.gamma``, renamed by OpenVLA because transformers rewrites parameters called
``gamma``; plain ``.gamma`` is read too), ``patch_embed.proj`` as a convolution,
``pos_embed`` / ``cls_token`` / ``reg_token`` with a leading batch axis. The projector is
``projector.fc1..3`` and the LM ``language_model.`` + the Llama names of
``policies.lm.keymap``.

OpenVLA reads each tower's second-to-last block, so the last block, the final norms and
SigLIP's attention-pool head are never used: they are skipped by name (and not built). Any
other tensor must land on a parameter, else ``BadInput`` names it.
"""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
from flax import nnx

from rlinf_jax.policies.convert import keys, store
from rlinf_jax.policies.convert.keys import Row, Skip
from rlinf_jax.policies.lm import keymap as lm_keymap
from rlinf_jax.policies.lm.hf_checkpoint import (
    read_hf_config,
)
from rlinf_jax.policies.vla.openvla import OpenVLA, OpenVLAConfig

TOWERS = ("vision_backbone.featurizer.", "vision_backbone.fused_featurizer.")

_QKV = (
    "blocks.{layer}.attn.q_proj",
    "blocks.{layer}.attn.k_proj",
    "blocks.{layer}.attn.v_proj",
)
TIMM_VIT_ROWS = (
    Row("patch_embed.proj.weight", "patch_kernel", "conv"),
    Row("patch_embed.proj.bias", "patch_bias"),
    Row("pos_embed", "pos_embed", "flat"),
    Row("cls_token", "cls_token", "flat"),
    Row("reg_token", "reg_tokens", "flat"),
    Row("blocks.{layer}.norm1.weight", "blocks.{layer}.norm1.scale"),
    Row("blocks.{layer}.norm1.bias", "blocks.{layer}.norm1.bias"),
    Row("blocks.{layer}.attn.qkv.weight", tuple(f"{p}.kernel" for p in _QKV), "T"),
    Row("blocks.{layer}.attn.qkv.bias", tuple(f"{p}.bias" for p in _QKV)),
    Row("blocks.{layer}.attn.proj.weight", "blocks.{layer}.attn.o_proj.kernel", "T"),
    Row("blocks.{layer}.attn.proj.bias", "blocks.{layer}.attn.o_proj.bias"),
    Row("blocks.{layer}.ls1.scale_factor", "blocks.{layer}.ls1"),
    Row("blocks.{layer}.ls1.gamma", "blocks.{layer}.ls1"),
    Row("blocks.{layer}.norm2.weight", "blocks.{layer}.norm2.scale"),
    Row("blocks.{layer}.norm2.bias", "blocks.{layer}.norm2.bias"),
    Row("blocks.{layer}.mlp.fc1.weight", "blocks.{layer}.mlp.fc1.kernel", "T"),
    Row("blocks.{layer}.mlp.fc1.bias", "blocks.{layer}.mlp.fc1.bias"),
    Row("blocks.{layer}.mlp.fc2.weight", "blocks.{layer}.mlp.fc2.kernel", "T"),
    Row("blocks.{layer}.mlp.fc2.bias", "blocks.{layer}.mlp.fc2.bias"),
    Row("blocks.{layer}.ls2.scale_factor", "blocks.{layer}.ls2"),
    Row("blocks.{layer}.ls2.gamma", "blocks.{layer}.ls2"),
)
PROJECTOR_ROWS = tuple(
    Row(f"projector.fc{i}.{kind}", f"projector.fc{i}.{'kernel' if kind == 'weight' else 'bias'}", "T" if kind == "weight" else "")
    for i in (1, 2, 3)
    for kind in ("weight", "bias")
)  # fmt: skip
LM_ROWS = tuple(Row("language_model." + r.hf, "llm." + r.ours, r.transform) for r in lm_keymap.KEY_MAP)


def key_map(config: OpenVLAConfig) -> tuple[tuple[Row, ...], tuple[Skip, ...]]:
    """(rows, skips) of an OpenVLA checkpoint with this config."""
    rows = [*PROJECTOR_ROWS, *LM_ROWS]
    skips = [
        Skip(
            r"language_model\..*rotary_emb\.inv_freq",
            "a buffer recomputed from the config",
        )
    ]
    if config.text.tie_word_embeddings:
        skips.append(Skip(r"language_model\.lm_head\.weight", "tied to the embeddings"))
    for i, depth in enumerate(config.vision_depths):
        src = TOWERS[i]
        rows += keys.prefixed(src, TIMM_VIT_ROWS, f"featurizers.{i}.")
        p = src.replace(".", r"\.")
        skips += [
            Skip(
                rf"{p}blocks\.{depth - 1}\..*",
                "the last block: OpenVLA reads the second-to-last block's output",
            ),
            Skip(
                rf"{p}(norm|fc_norm)\.(weight|bias)",
                "final norms: never applied to the features OpenVLA reads",
            ),
            Skip(
                rf"{p}attn_pool\..*",
                "SigLIP's attention-pool head: OpenVLA uses patch features, not the pooled one",
            ),
        ]
    return tuple(rows), tuple(skips)


def build(hf: dict, dtype=jnp.float32, param_dtype=None) -> OpenVLA:
    return OpenVLA(
        OpenVLAConfig.from_hf_config(hf),
        dtype=dtype,
        param_dtype=param_dtype,
        rngs=nnx.Rngs(0),
    )


def from_pretrained(path, dtype=jnp.float32, param_dtype=None) -> OpenVLA:
    """An ``OpenVLA`` from an OpenVLA checkpoint directory (config.json + safetensors)."""
    hf = read_hf_config(path)
    config = OpenVLAConfig.from_hf_config(hf)
    return store.model_from_checkpoint(path, build, hf, key_map(config), "OpenVLA model", dtype, param_dtype)


def convert(src, out_dir, dtype="auto") -> Path:
    """OpenVLA checkpoint directory ``src`` -> converted directory ``out_dir``."""
    return store.convert_directory(from_pretrained, src, out_dir, dtype)


def load(path, dtype=None) -> OpenVLA:
    """The ``OpenVLA`` written by ``convert``."""
    return store.load_converted(path, build, dtype)
