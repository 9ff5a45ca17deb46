"""Tiny, fully random Hugging Face models of each supported family, built locally.

For parity tests, benchmarks and examples: nothing is downloaded. Sizes are deliberately
awkward (head_dim not a power of two, 3 query heads per KV head, odd vocabulary), and every
parameter, norm weights and biases included, is random (``randn * scale``, plus 1 for norm
weights of the families whose norms multiply by the weight itself; Gemma's multiply by
``1 + weight`` and get the noise alone), so a transposed matrix, a missing ``1 +`` or swapped
q/k would show in the logits.
Needs torch and transformers (the ``test`` extra).
"""

from __future__ import annotations

from pathlib import Path

# One entry per family, each exercising that family's switches.
TINY_CONFIGS = {
    # Llama 3 rope scaling with a short original context so all three frequency bands occur;
    # explicit head_dim (12) unlike hidden / heads (10); biases on attention and MLP.
    "llama": {
        "vocab_size": 97,
        "hidden_size": 60,
        "intermediate_size": 88,
        "num_hidden_layers": 2,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "head_dim": 12,
        "attention_bias": True,
        "mlp_bias": True,
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 500.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    },
    # Qwen2: q/k/v biases, tied embeddings, head_dim derived (60 / 6 = 10).
    "qwen2": {
        "vocab_size": 97,
        "hidden_size": 60,
        "intermediate_size": 88,
        "num_hidden_layers": 2,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0},
    },
    # Qwen3: per-head q/k RMSNorm, explicit head_dim 20 (hidden 48); the rarely used
    # attention_bias switch on (biases on q/k/v and o).
    "qwen3": {
        "vocab_size": 97,
        "hidden_size": 48,
        "intermediate_size": 88,
        "num_hidden_layers": 2,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "head_dim": 20,
        "attention_bias": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
    },
    # Gemma: 1 + scale norms, sqrt(hidden) embedding scale, tanh-GELU MLP, tied embeddings;
    # 3 query heads on 1 KV head with an explicit head_dim (20) unlike hidden / heads (16).
    "gemma": {
        "vocab_size": 301,
        "hidden_size": 48,
        "intermediate_size": 88,
        "num_hidden_layers": 2,
        "num_attention_heads": 3,
        "num_key_value_heads": 1,
        "head_dim": 20,
        "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0},
    },
}


def tiny_hf_model(family: str, seed: int = 0, scale: float = 0.25, attn_implementation: str = "eager", **overrides):
    """A random ``transformers`` causal LM of ``family`` in eval mode (eager attention: the
    plainest reference)."""
    import torch
    import transformers

    config_cls = {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "gemma": transformers.GemmaConfig,
    }[family]
    config = config_cls(**{**TINY_CONFIGS[family], **overrides})
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    randomize_(model, seed, scale, unit_norms=family != "gemma")
    # Greedy parity runs a fixed number of tokens: no end token, no sampling defaults.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model.generation_config.do_sample = False
    return model


def randomize_(model, seed: int = 0, scale: float = 0.25, unit_norms: bool = True) -> None:
    """Overwrite every entry of ``model.state_dict()`` with ``randn * scale`` (in place), plus 1
    on norm weights when ``unit_norms`` (norms that multiply by the weight itself)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.state_dict().items():
            if not p.is_floating_point():
                continue
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32) * scale
            p.copy_(noise + (1.0 if unit_norms and "norm" in name else 0.0))


def save_tiny(family: str, out_dir, seed: int = 0, **overrides):
    """Write a tiny random model to ``out_dir``; returns ``(path, torch_model)``."""
    model = tiny_hf_model(family, seed=seed, **overrides)
    model.save_pretrained(str(out_dir))
    return Path(out_dir), model
