"""Hugging Face checkpoint keys <-> our parameter paths, as one declarative table.

Each row pairs a checkpoint-key template with a parameter-path template and a transform.
Templates name their variable parts (``{layer}``, ``{proj}``), so the same row reads a
checkpoint (HF key -> our path) and writes one (our path -> HF key). ``T`` transposes: torch
``nn.Linear`` stores ``[out, in]``, our dense kernels ``[in, out]``; transposing is its own
inverse. Keys that carry no parameter (``rotary_emb.inv_freq``) are ignored explicitly;
anything else that matches no row is an error, never silently dropped.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from rlinf_jax.policies.lm.config import LMConfig

_FIELDS = {"layer": r"\d+", "proj": r"[a-z]+"}


@dataclasses.dataclass(frozen=True)
class Row:
    hf: str  # checkpoint key template
    ours: str  # parameter path template ('.'-joined)
    transform: str = ""  # "" (as is) or "T" (transpose a 2-D matrix)

    def _regex(self, template: str) -> re.Pattern:
        parts = re.split(r"\{(\w+)\}", template)
        pattern = "".join(
            re.escape(p) if i % 2 == 0 else f"(?P<{p}>{_FIELDS[p]})" for i, p in enumerate(parts)
        )
        return re.compile(pattern + r"\Z")

    def match_hf(self, key: str) -> str | None:
        m = self._regex(self.hf).match(key)
        return self.ours.format(**m.groupdict()) if m else None

    def match_ours(self, path: str) -> str | None:
        m = self._regex(self.ours).match(path)
        return self.hf.format(**m.groupdict()) if m else None


# Llama, Qwen2 and Qwen3 share one naming scheme; rows for parameters a family lacks (biases,
# q/k norms) simply find no target in that family's model, which is reported as unexpected.
KEY_MAP: tuple[Row, ...] = (
    Row("model.embed_tokens.weight", "embed.embedding"),
    Row("model.layers.{layer}.input_layernorm.weight", "layers.{layer}.attn_norm.scale"),
    Row("model.layers.{layer}.self_attn.{proj}_proj.weight", "layers.{layer}.attn.{proj}_proj.kernel", "T"),
    Row("model.layers.{layer}.self_attn.{proj}_proj.bias", "layers.{layer}.attn.{proj}_proj.bias"),
    Row("model.layers.{layer}.self_attn.{proj}_norm.weight", "layers.{layer}.attn.{proj}_norm.scale"),
    Row("model.layers.{layer}.post_attention_layernorm.weight", "layers.{layer}.mlp_norm.scale"),
    Row("model.layers.{layer}.mlp.{proj}_proj.weight", "layers.{layer}.mlp.{proj}_proj.kernel", "T"),
    Row("model.layers.{layer}.mlp.{proj}_proj.bias", "layers.{layer}.mlp.{proj}_proj.bias"),
    Row("model.norm.weight", "final_norm.scale"),
    # Adaptive norms (openpi's patched Gemma, pi0.5's expert): a dense layer in place of the weight.
    Row("model.layers.{layer}.input_layernorm.dense.weight", "layers.{layer}.attn_norm.dense.kernel", "T"),
    Row("model.layers.{layer}.input_layernorm.dense.bias", "layers.{layer}.attn_norm.dense.bias"),
    Row("model.layers.{layer}.post_attention_layernorm.dense.weight", "layers.{layer}.mlp_norm.dense.kernel", "T"),
    Row("model.layers.{layer}.post_attention_layernorm.dense.bias", "layers.{layer}.mlp_norm.dense.bias"),
    Row("model.norm.dense.weight", "final_norm.dense.kernel", "T"),
    Row("model.norm.dense.bias", "final_norm.dense.bias"),
    Row("lm_head.weight", "lm_head.kernel", "T"),
)

# Buffers some exporters saved with the weights; recomputed from the config here.
IGNORED = (re.compile(r".*rotary_emb\.inv_freq\Z"),)


def is_ignored(key: str, config: LMConfig) -> bool:
    if any(p.match(key) for p in IGNORED):
        return True
    # Some tied checkpoints still carry a copy of the embeddings as the head; the tie wins.
    return config.tie_word_embeddings and key == "lm_head.weight"


def to_ours(key: str) -> tuple[str, str] | None:
    """(parameter path, transform) for a checkpoint key, or None if no row matches."""
    for row in KEY_MAP:
        path = row.match_hf(key)
        if path is not None:
            return path, row.transform
    return None


def to_hf(path: str) -> tuple[str, str]:
    """(checkpoint key, transform) for one of our parameter paths."""
    for row in KEY_MAP:
        key = row.match_ours(path)
        if key is not None:
            return key, row.transform
    raise KeyError(f"no key-map row for parameter {path!r}")


def apply(transform: str, array: np.ndarray) -> np.ndarray:
    if transform == "T":
        return array.T
    return array


def transformed_shape(transform: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(reversed(shape)) if transform == "T" else tuple(shape)
