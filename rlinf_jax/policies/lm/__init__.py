"""Llama / Qwen / Gemma causal LMs in Flax NNX, their Hugging Face checkpoint I/O, LoRA,
the value model and response log-probabilities."""

from rlinf_jax.policies.lm.attention import KVCache
from rlinf_jax.policies.lm.config import SUPPORTED_MODEL_TYPES, LMConfig, RopeConfig
from rlinf_jax.policies.lm.converted import convert, load_converted
from rlinf_jax.policies.lm.hf_checkpoint import from_pretrained, save_pretrained
from rlinf_jax.policies.lm.model import CausalLM, set_matmul

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "CausalLM",
    "KVCache",
    "LMConfig",
    "RopeConfig",
    "convert",
    "from_pretrained",
    "load_converted",
    "save_pretrained",
    "set_matmul",
]
