"""Architecture of a Llama / Qwen / Gemma causal LM, read from (and written back to) a Hugging
Face ``config.json``.

One dataclass covers the four families because they differ in a handful of switches
(attention biases, per-head q/k norms, tied embeddings, RoPE scaling, and for Gemma a
``1 + scale`` RMSNorm, embeddings scaled by ``sqrt(hidden_size)`` and a tanh-GELU MLP), not in
structure. Fields the families default differently (``head_dim`` for Qwen3 and Gemma) follow
transformers' own defaults, so a hand-written config means the same thing here as there.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from rlinf_jax.errors import BadInput

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "gemma")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma": "GemmaForCausalLM",
}
# Gemma's activation names in config.json; all mean the tanh approximation (transformers maps
# the legacy "gelu" onto it too, since that is what the original checkpoints were trained with).
_GEMMA_ACTS = ("gelu_pytorch_tanh", "gelu_tanh", "gelu")


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding frequencies: base ``theta`` plus an optional scaling rule."""

    theta: float = 10_000.0
    kind: str = "default"  # one of SUPPORTED_ROPE_TYPES
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_position_embeddings: int = 8192  # llama3 only

    def inv_freq(self, head_dim: int) -> np.ndarray:
        """Inverse frequencies ``[head_dim // 2]`` in float64, scaled as the rope type says."""
        inv = 1.0 / (self.theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
        if self.kind == "linear":
            return inv / self.factor
        if self.kind == "llama3":
            # Llama 3.1: long wavelengths are divided by `factor`, short ones kept, and the
            # band between them interpolated smoothly.
            low_wavelen = self.original_max_position_embeddings / self.low_freq_factor
            high_wavelen = self.original_max_position_embeddings / self.high_freq_factor
            wavelen = 2 * math.pi / inv
            scaled = np.where(wavelen > low_wavelen, inv / self.factor, inv)
            smooth = (self.original_max_position_embeddings / wavelen - self.low_freq_factor) / (
                self.high_freq_factor - self.low_freq_factor
            )
            smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
            medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
            return np.where(medium, smoothed, scaled)
        return inv


@dataclasses.dataclass(frozen=True)
class LMConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = dataclasses.field(default_factory=RopeConfig)
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v (and, except Qwen2, o) projections carry biases
    mlp_bias: bool = False  # llama only
    qk_norm: bool = False  # qwen3: RMSNorm on each query / key head before RoPE
    max_position_embeddings: int = 2048
    adarms_cond_dim: int = 0  # > 0: adaptive RMSNorms conditioned on a vector of this width (pi0.5's expert)
    hf_extra: tuple[tuple[str, Any], ...] = ()  # other config.json keys, written back on export

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise BadInput(
                f"num_attention_heads={self.num_heads} is not a multiple of "
                f"num_key_value_heads={self.num_kv_heads}; grouped-query attention needs it to be"
            )
        if self.head_dim < 2 or self.head_dim % 2:
            raise BadInput(
                f"head_dim={self.head_dim} (hidden_size / num_attention_heads unless config.json sets head_dim) "
                "must be even and at least 2 for rotary embeddings"
            )

    @property
    def q_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def is_gemma(self) -> bool:
        """Gemma's three departures from Llama: RMSNorm by ``1 + scale``, token embeddings
        times ``sqrt(hidden_size)``, ``gelu_tanh(gate) * up`` in the MLP."""
        return self.model_type == "gemma"

    @property
    def o_proj_bias(self) -> bool:
        # Qwen2 puts biases on q/k/v only; Llama's and Qwen3's `attention_bias` cover o_proj too.
        return self.attention_bias and self.model_type != "qwen2"

    @classmethod
    def from_hf_config(cls, hf: dict) -> LMConfig:
        """Read a transformers ``config.json`` dict (transformers 4 or 5 layout)."""
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise BadInput(
                f"config.json model_type={model_type!r} is not supported; "
                f"supported types: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
            if key not in hf:
                raise BadInput(f"config.json lacks {key!r}, which a {model_type} model needs")
        # transformers 4 Gemma configs name the activation `hidden_activation`.
        act = hf.get("hidden_activation") or hf.get("hidden_act")
        if model_type == "gemma":
            if (act or "gelu_pytorch_tanh") not in _GEMMA_ACTS:
                raise BadInput(
                    f"config.json hidden_act={act!r} is not supported for gemma; use {_GEMMA_ACTS[0]!r}"
                )
        elif (act or "silu") not in ("silu", "swish"):
            raise BadInput(f"config.json hidden_act={act!r} is not supported; only 'silu' is")
        if hf.get("use_sliding_window"):
            raise BadInput("config.json use_sliding_window=true is not supported; set it to false")
        num_heads = int(hf["num_attention_heads"])
        num_kv_heads = int(hf.get("num_key_value_heads") or num_heads)
        default_head_dim = {"qwen3": 128, "gemma": 256}.get(model_type, int(hf["hidden_size"]) // num_heads)
        head_dim = int(hf.get("head_dim") or default_head_dim)
        # Qwen2 always has q/k/v biases; its config has no switch for them.
        attention_bias = model_type == "qwen2" or bool(hf.get("attention_bias", False))
        known = {
            "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta",
            "rope_scaling", "rope_parameters", "tie_word_embeddings", "attention_bias", "mlp_bias",
            "max_position_embeddings", "architectures", "dtype", "torch_dtype", "transformers_version",
            "hidden_act", "hidden_activation", "use_adarms", "adarms_cond_dim",
        }
        extra = tuple(sorted((k, v) for k, v in hf.items() if k not in known))
        return cls(
            model_type=model_type,
            vocab_size=int(hf["vocab_size"]),
            hidden_size=int(hf["hidden_size"]),
            intermediate_size=int(hf["intermediate_size"]),
            num_layers=int(hf["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope=_rope_from_hf(hf),
            # GemmaConfig ties by default, the others do not.
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", model_type == "gemma")),
            attention_bias=attention_bias,
            mlp_bias=bool(hf.get("mlp_bias", False)) if model_type == "llama" else False,
            qk_norm=model_type == "qwen3",
            max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
            # openpi's patched Gemma (pi0.5's expert): use_adarms with the conditioning width.
            adarms_cond_dim=int(hf.get("adarms_cond_dim") or 0) if hf.get("use_adarms") else 0,
            hf_extra=_freeze(extra),
        )

    def to_hf_config(self, dtype: str = "float32") -> dict:
        """A transformers 5 ``config.json`` dict for this architecture."""
        rope: dict[str, Any] = {"rope_type": self.rope.kind, "rope_theta": self.rope.theta}
        if self.rope.kind in ("linear", "llama3"):
            rope["factor"] = self.rope.factor
        if self.rope.kind == "llama3":
            rope.update(
                low_freq_factor=self.rope.low_freq_factor,
                high_freq_factor=self.rope.high_freq_factor,
                original_max_position_embeddings=self.rope.original_max_position_embeddings,
            )
        out: dict[str, Any] = {k: _thaw(v) for k, v in self.hf_extra}
        out.update(
            architectures=[_ARCHITECTURES[self.model_type]],
            model_type=self.model_type,
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            hidden_act="gelu_pytorch_tanh" if self.is_gemma else "silu",
            rms_norm_eps=self.rms_norm_eps,
            rope_parameters=rope,
            tie_word_embeddings=self.tie_word_embeddings,
            max_position_embeddings=self.max_position_embeddings,
            dtype=dtype,
        )
        if self.model_type != "qwen2":
            out["attention_bias"] = self.attention_bias
        if self.model_type == "llama":
            out["mlp_bias"] = self.mlp_bias
        if self.adarms_cond_dim:
            out.update(use_adarms=True, adarms_cond_dim=self.adarms_cond_dim)
        return out


def _rope_from_hf(hf: dict) -> RopeConfig:
    # transformers 5 keeps everything in `rope_parameters`; older files have a top-level
    # `rope_theta` and an optional `rope_scaling` dict (with `type` or `rope_type`).
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    if any(isinstance(v, dict) for v in params.values()):
        raise BadInput("config.json rope_parameters nested per layer type are not supported")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in SUPPORTED_ROPE_TYPES:
        raise BadInput(
            f"config.json rope type {kind!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise BadInput(f"config.json partial_rotary_factor={partial} is not supported; only 1.0 is")
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10_000.0)))
    if kind == "default":
        return RopeConfig(theta=theta)
    if "factor" not in params:
        raise BadInput(f"config.json rope type {kind!r} needs a 'factor'")
    if kind == "linear":
        return RopeConfig(theta=theta, kind=kind, factor=float(params["factor"]))
    missing = [k for k in ("low_freq_factor", "high_freq_factor") if k not in params]
    if missing:
        raise BadInput(f"config.json rope type 'llama3' lacks {', '.join(missing)}")
    return RopeConfig(
        theta=theta,
        kind=kind,
        factor=float(params["factor"]),
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=int(
            params.get("original_max_position_embeddings")
            or hf.get("original_max_position_embeddings")
            or hf.get("max_position_embeddings", 8192)
        ),
    )


def _freeze(value):
    """Make config.json values hashable so the frozen dataclass can hold them."""
    if isinstance(value, dict):
        return ("__dict__", tuple(sorted((k, _freeze(v)) for k, v in value.items())))
    if isinstance(value, list):
        return ("__list__", tuple(_freeze(v) for v in value))
    if isinstance(value, tuple):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value):
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "__dict__":
        return {k: _thaw(v) for k, v in value[1]}
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "__list__":
        return [_thaw(v) for v in value[1]]
    return value
