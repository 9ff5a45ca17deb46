"""The language models the LM benchmarks build locally for both sides (no hub): their
Qwen2 shapes and the scale of their random weights. No heavy imports, so a parent process
can read them before it pins itself or starts a side."""

from __future__ import annotations

SIZES = {
    "tiny": {
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 512,
        "vocab_size": 2048,
        "tie_word_embeddings": True,
    },
    # Qwen2.5-0.5B's published configuration (config.json), shapes only.
    "0.5b": {
        "hidden_size": 896,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "intermediate_size": 4864,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
    },
}
# Weight scale of the random init: larger models need smaller weights to keep activations
# (and the greedy comparisons) finite in float32.
SCALES = {"tiny": 0.1, "0.5b": 0.02}
