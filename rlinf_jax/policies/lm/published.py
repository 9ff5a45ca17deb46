"""Published architectures by name: the ``config.json`` fields of models the recipes name, so
that a run can be planned (`python -m rlinf_jax.plan`) on a machine that holds no weights.

A model directory's own ``config.json`` always wins; these are read only when the directory
is not there, matched on its folder name (``/models/Qwen2.5-7B-Instruct`` is Qwen2.5-7B:
instruction tuning changes weights, not shapes). The figures are those of the models'
Hugging Face configs.
"""

from __future__ import annotations

from pathlib import PurePath

PUBLISHED: dict[str, dict] = {
    "qwen2.5-0.5b": {
        "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
        "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "tie_word_embeddings": True,
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    },
    "qwen2.5-1.5b": {
        "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960,
        "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2, "tie_word_embeddings": True,
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    },
    "qwen2.5-3b": {
        "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 11008,
        "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2, "tie_word_embeddings": True,
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    },
    "qwen2.5-7b": {
        "model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
        "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "tie_word_embeddings": False,
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    },
    # The language backbones of the VLA families: OpenVLA-7B's Llama 2 (its vocabulary padded
    # to 32064) and pi0's PaliGemma Gemma-2B.
    "llama-2-7b": {
        "model_type": "llama", "vocab_size": 32064, "hidden_size": 4096, "intermediate_size": 11008,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "tie_word_embeddings": False,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    },
    "gemma-2b": {
        "model_type": "gemma", "vocab_size": 257152, "hidden_size": 2048, "intermediate_size": 16384,
        "num_hidden_layers": 18, "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256,
        "tie_word_embeddings": True, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "hidden_act": "gelu_pytorch_tanh",
    },
}


# The vision-language-action families at their published sizes, as their own config.json
# fields (read by `OpenVLAConfig.from_hf_config` and `Pi0Config.from_hf_config`): what
# ``actor.model.architecture`` names for an embodied run planned at real size.
# - openvla-7b: Prismatic's fused DINOv2-L/14 (with registers) + SigLIP so400m/14 towers at
#   224 px and Llama 2 7B with its vocabulary padded by 64 rows (openvla/openvla-7b);
# - pi0: PaliGemma 3B (SigLIP so400m/14 at 224 px, Gemma 2B) and the Gemma-300M action
#   expert, chunks of 50 actions of up to 32 dimensions, 10 denoising steps (openpi's pi0);
# - pi05: the same sizes with pi0.5's adaptive-norm expert and the state in the prompt.
PUBLISHED_VLA: dict[str, dict] = {
    "openvla-7b": {
        "model_type": "openvla", "use_fused_vision_backbone": True,
        "timm_model_ids": ["vit_large_patch14_reg4_dinov2", "vit_so400m_patch14_siglip_224"],
        "image_sizes": [224, 224], "n_action_bins": 256, "pad_to_multiple_of": 64,
        "text_config": PUBLISHED["llama-2-7b"],
    },
    "pi0": {
        "model_type": "pi0", "chunk_size": 50, "max_state_dim": 32, "max_action_dim": 32, "num_inference_steps": 10,
        "vlm_config": {
            "model_type": "paligemma", "projection_dim": 2048, "image_token_id": 257152,
            "vision_config": {
                "model_type": "siglip_vision_model", "hidden_size": 1152, "intermediate_size": 4304,
                "num_hidden_layers": 27, "num_attention_heads": 16, "patch_size": 14, "image_size": 224,
            },
            "text_config": PUBLISHED["gemma-2b"],
        },
        "dit_config": {
            "model_type": "gemma", "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 18,
            "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256,
        },
    },
    # lerobot's PI05Config (openpi's variant names; `policies.vla.pi05` holds their sizes).
    "pi05": {
        "model_type": "pi05", "type": "pi05", "paligemma_variant": "gemma_2b", "action_expert_variant": "gemma_300m",
        "chunk_size": 50, "max_state_dim": 32, "max_action_dim": 32, "num_inference_steps": 10,
        "image_resolution": [224, 224],
    },
}


# GR00T-N1.5's published Eagle backbone (lerobot's ``lerobot/eagle2hg-processor-groot-n1p5`` config, the
# same as Isaac-GR00T's): SigLIP so400m/14 at 224 px, 256 tokens per image through one linear
# connector (no pixel shuffle), Qwen3-1.7B.
PUBLISHED_EAGLE = {
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152, "intermediate_size": 4304,
                      "num_hidden_layers": 27, "num_attention_heads": 16, "image_size": 224, "patch_size": 14,
                      "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6},
    "text_config": {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 151680, "hidden_size": 2048,
                    "intermediate_size": 6144, "num_hidden_layers": 28, "num_attention_heads": 16,
                    "num_key_value_heads": 8, "head_dim": 128, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
                    "tie_word_embeddings": True, "max_position_embeddings": 40960},
    "select_layer": -1, "image_token_index": 151669, "force_image_size": 224, "use_pixel_shuffle": False,
    "downsample_ratio": 0.5, "mlp_connector_layers": 1,
}
# GR00T-N1.5-3B's config.json (``nvidia/GR00T-N1.5-3B``): the LM cut to 12 layers, no projection,
# a 16-layer DiT (1536 wide) that cross-attends in even layers, 4 self-attention layers over
# the 2048-wide features, 16-step chunks of 32 action dimensions, 4 denoising steps.
PUBLISHED_GR00T = {
    "model_type": "gr00t_n1_5", "action_horizon": 16, "action_dim": 32,
    "backbone_cfg": {"select_layer": 12, "project_to_dim": None},
    "action_head_cfg": {
        "action_dim": 32, "action_horizon": 16, "add_pos_embed": True, "backbone_embedding_dim": 2048,
        "diffusion_model_cfg": {"attention_head_dim": 48, "cross_attention_dim": 2048, "interleave_self_attention": True,
                                "norm_type": "ada_norm", "num_attention_heads": 32, "num_layers": 16,
                                "output_dim": 1024, "positional_embeddings": None},
        "hidden_size": 1024, "input_embedding_dim": 1536, "max_state_dim": 64, "noise_beta_alpha": 1.5,
        "noise_beta_beta": 1.0, "noise_s": 0.999, "num_inference_timesteps": 4, "num_target_vision_tokens": 32,
        "num_timestep_buckets": 1000, "use_vlln": True,
        "vl_self_attention_cfg": {"attention_head_dim": 64, "num_attention_heads": 32, "num_layers": 4,
                                  "positional_embeddings": None},
    },
}


# GR00T-N1.5-3B as an embodied run's architecture: its config.json with the backbone's config inside.
PUBLISHED_VLA["gr00t-n1.5"] = {**PUBLISHED_GR00T, "backbone_cfg": {**PUBLISHED_GR00T["backbone_cfg"],
                                                                    "eagle_config": PUBLISHED_EAGLE}}


def published_config(path: str) -> dict | None:
    """The published ``config.json`` fields of the model a path names (its folder name
    holds a known model's name, case aside), or None."""
    name = PurePath(str(path)).name.lower()
    # Where several names occur in one folder name, the longest (the most specific) wins.
    matches = [key for key in PUBLISHED if key in name]
    return dict(PUBLISHED[max(matches, key=len)]) if matches else None
