"""Llama / Qwen family causal LMs in Flax NNX, and their Hugging Face checkpoint I/O."""

from rlinf_jax.policies.lm.attention import KVCache
from rlinf_jax.policies.lm.config import SUPPORTED_MODEL_TYPES, LMConfig, RopeConfig
from rlinf_jax.policies.lm.converted import convert, load_converted
from rlinf_jax.policies.lm.hf_checkpoint import from_pretrained, save_pretrained
from rlinf_jax.policies.lm.model import CausalLM
from rlinf_jax.policies.lm.tokenizer import load_tokenizer

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "CausalLM",
    "KVCache",
    "LMConfig",
    "RopeConfig",
    "convert",
    "from_pretrained",
    "load_converted",
    "load_tokenizer",
    "save_pretrained",
]
