"""A torch OpenVLA assembled from transformers models, and its weights in OpenVLA's
checkpoint layout: the reference of the OpenVLA / OpenVLA-OFT parity tests.

The stand-in checkpoint has OpenVLA's layout and key names (timm towers under
``vision_backbone.featurizer.`` / ``fused_featurizer.`` with fused ``attn.qkv``,
``ls1/ls2.scale_factor``, ``pos_embed`` without a CLS row, plus ``projector.fc1..3`` and
``language_model.*``), the weights OpenVLA never uses included (last blocks, final norms,
SigLIP's attention pool). The torch reference runs the same weights through transformers'
``Dinov2WithRegistersModel`` (CLS position row zeroed: timm's DINOv2 gives the CLS token no
position embedding), ``SiglipVisionModel`` (exact GELU, as timm's so400m SigLIP), a torch
projector and ``LlamaForCausalLM``, following OpenVLA's forward: second-to-last block patch
features, concatenated, projected, inserted after BOS. Awkward tiny sizes: 28 px images,
patch 14, DINOv2 hidden 48 / SigLIP hidden 36 with 3 heads each, 3 register tokens, Llama
with 1 KV head and a vocabulary of 304 whose last 4 rows are padding and the 16 before them
are the action bins. Every parameter is random.
"""

from __future__ import annotations

import json

import numpy as np
import torch
import transformers
from safetensors.numpy import save_file

from rlinf_jax.policies.lm.tiny import tiny_hf_model

IMAGE, PATCH, DEPTH, REGS = 28, 14, 3, 3
VOCAB, PAD_ROWS, BINS = 304, 4, 16
VOCAB_END = VOCAB - PAD_ROWS  # 300: action ids 284..299
ACTION_DIM = 7
Q01 = [-0.5, -0.4, -0.3, -0.2, -0.1, -1.0, 0.0]
Q99 = [0.5, 0.6, 0.7, 0.2, 0.9, 1.0, 1.0]
MASK = [True] * 6 + [False]


def randomise(model, seed, scale=0.3):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.state_dict().items():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32) * scale
            is_norm = "norm" in name and name.endswith("weight")
            p.copy_(noise + (1.0 if is_norm else 0.0))
    return model.eval()


class TorchOpenVLA:
    """OpenVLA's forward on transformers / torch modules."""

    def __init__(self, seed=0):
        dcfg = transformers.Dinov2WithRegistersConfig(
            hidden_size=48, mlp_ratio=3, num_hidden_layers=DEPTH, num_attention_heads=3,
            image_size=IMAGE, patch_size=PATCH, num_register_tokens=REGS,
        )  # fmt: skip
        scfg = transformers.SiglipVisionConfig(
            hidden_size=36, intermediate_size=90, num_hidden_layers=DEPTH, num_attention_heads=3,
            image_size=IMAGE, patch_size=PATCH, hidden_act="gelu", vision_use_head=True,
        )  # fmt: skip
        for c in (dcfg, scfg):
            c._attn_implementation = "eager"
        self.dino = randomise(transformers.Dinov2WithRegistersModel(dcfg), seed + 1)
        with torch.no_grad():
            self.dino.embeddings.position_embeddings[:, 0] = 0.0
        self.siglip = randomise(transformers.SiglipVisionModel(scfg), seed + 2)
        torch.manual_seed(seed + 3)
        vision_dim, llm_dim = 48 + 36, 60
        self.projector = torch.nn.ModuleDict(
            {
                "fc1": torch.nn.Linear(vision_dim, 4 * vision_dim),
                "fc2": torch.nn.Linear(4 * vision_dim, llm_dim),
                "fc3": torch.nn.Linear(llm_dim, llm_dim),
            }
        )
        randomise(self.projector, seed + 4)
        with torch.no_grad():  # keep activations O(1) so that 1e-4 is an fp32-sized tolerance
            for layer in self.projector.values():
                layer.weight.mul_(layer.in_features**-0.5 / 0.3)
        self.llm = tiny_hf_model("llama", seed=seed + 5, vocab_size=VOCAB, num_key_value_heads=1)

    def projected(self, pixels):
        """pixels ``[B, 6, H, W]`` -> projected patches ``[B, N, llm_dim]``."""
        with torch.no_grad():
            d = self.dino(pixel_values=pixels[:, :3], output_hidden_states=True).hidden_states[DEPTH - 1]
            s = self.siglip(pixel_values=pixels[:, 3:], output_hidden_states=True).hidden_states[DEPTH - 1]
            x = torch.cat([d[:, 1 + REGS :], s], dim=-1)
            p = self.projector
            return p["fc3"](torch.nn.functional.gelu(p["fc2"](torch.nn.functional.gelu(p["fc1"](x)))))

    def logits(self, pixels, ids):
        """One unpadded row: pixels ``[1, 6, H, W]``, ids ``[1, T]`` -> ``[1, T + N, V]``."""
        with torch.no_grad():
            emb = self.llm.get_input_embeddings()(ids)
            mm = torch.cat([emb[:, :1], self.projected(pixels), emb[:, 1:]], dim=1)
            return self.llm(inputs_embeds=mm).logits

    def checkpoint(self) -> dict[str, np.ndarray]:
        """The weights under OpenVLA's checkpoint keys (timm layout)."""
        out = {}
        sd = {k: v.numpy() for k, v in self.dino.state_dict().items()}
        f = "vision_backbone.featurizer."
        e = "embeddings."
        out[f + "patch_embed.proj.weight"] = sd[e + "patch_embeddings.projection.weight"]
        out[f + "patch_embed.proj.bias"] = sd[e + "patch_embeddings.projection.bias"]
        out[f + "pos_embed"] = sd[e + "position_embeddings"][:, 1:]
        out[f + "cls_token"] = sd[e + "cls_token"]
        out[f + "reg_token"] = sd[e + "register_tokens"]
        for i in range(DEPTH):
            s, t = f"encoder.layer.{i}.", f"{f}blocks.{i}."
            qkv = [sd[f"{s}attention.{p}_proj.weight"] for p in "qkv"]
            out[t + "attn.qkv.weight"] = np.concatenate(qkv)
            out[t + "attn.qkv.bias"] = np.concatenate([sd[f"{s}attention.{p}_proj.bias"] for p in "qkv"])
            out[t + "attn.proj.weight"] = sd[s + "attention.o_proj.weight"]
            out[t + "attn.proj.bias"] = sd[s + "attention.o_proj.bias"]
            out[t + "ls1.scale_factor"] = sd[s + "layer_scale1.lambda1"]
            out[t + "ls2.scale_factor"] = sd[s + "layer_scale2.lambda1"]
            for n in ("norm1", "norm2", "mlp.fc1", "mlp.fc2"):
                out[t + n + ".weight"], out[t + n + ".bias"] = (
                    sd[s + n + ".weight"],
                    sd[s + n + ".bias"],
                )
        out[f + "norm.weight"], out[f + "norm.bias"] = (
            sd["layernorm.weight"],
            sd["layernorm.bias"],
        )

        sd = {k: v.numpy() for k, v in self.siglip.state_dict().items()}
        f = "vision_backbone.fused_featurizer."
        out[f + "patch_embed.proj.weight"] = sd[e + "patch_embedding.weight"]
        out[f + "patch_embed.proj.bias"] = sd[e + "patch_embedding.bias"]
        out[f + "pos_embed"] = sd[e + "position_embedding.weight"][None]
        for i in range(DEPTH):
            s, t = f"encoder.layers.{i}.", f"{f}blocks.{i}."
            out[t + "attn.qkv.weight"] = np.concatenate([sd[f"{s}self_attn.{p}_proj.weight"] for p in "qkv"])
            out[t + "attn.qkv.bias"] = np.concatenate([sd[f"{s}self_attn.{p}_proj.bias"] for p in "qkv"])
            out[t + "attn.proj.weight"] = sd[s + "self_attn.out_proj.weight"]
            out[t + "attn.proj.bias"] = sd[s + "self_attn.out_proj.bias"]
            for a, b in (
                ("norm1", "layer_norm1"),
                ("norm2", "layer_norm2"),
                ("mlp.fc1", "mlp.fc1"),
                ("mlp.fc2", "mlp.fc2"),
            ):
                out[t + a + ".weight"], out[t + a + ".bias"] = (
                    sd[s + b + ".weight"],
                    sd[s + b + ".bias"],
                )
        out[f + "norm.weight"], out[f + "norm.bias"] = (
            sd["post_layernorm.weight"],
            sd["post_layernorm.bias"],
        )
        D = 36
        out[f + "attn_pool.latent"] = sd["head.probe"]
        out[f + "attn_pool.q.weight"] = sd["head.attention.in_proj_weight"][:D]
        out[f + "attn_pool.q.bias"] = sd["head.attention.in_proj_bias"][:D]
        out[f + "attn_pool.kv.weight"] = sd["head.attention.in_proj_weight"][D:]
        out[f + "attn_pool.kv.bias"] = sd["head.attention.in_proj_bias"][D:]
        for a, b in (
            ("proj", "attention.out_proj"),
            ("norm", "layernorm"),
            ("mlp.fc1", "mlp.fc1"),
            ("mlp.fc2", "mlp.fc2"),
        ):
            out[f"{f}attn_pool.{a}.weight"], out[f"{f}attn_pool.{a}.bias"] = (
                sd[f"head.{b}.weight"],
                sd[f"head.{b}.bias"],
            )

        for k, v in self.projector.state_dict().items():
            out["projector." + k] = v.numpy()
        for k, v in self.llm.state_dict().items():
            out["language_model." + k] = v.numpy()
        return {k: np.ascontiguousarray(v) for k, v in out.items()}

    def config(self) -> dict:
        return {
            "model_type": "openvla",
            "architectures": ["OpenVLAForActionPrediction"],
            "use_fused_vision_backbone": True,
            "timm_model_ids": ["tiny_dinov2_reg", "tiny_siglip"],
            "timm_override_act_layers": [None, None],
            "timm_model_configs": {
                "tiny_dinov2_reg": {
                    "embed_dim": 48,
                    "depth": DEPTH,
                    "num_heads": 3,
                    "mlp_ratio": 3,
                    "patch_size": PATCH,
                    "reg_tokens": REGS,
                    "no_embed_class": True,
                    "init_values": 1e-5,
                },
                "tiny_siglip": {
                    "embed_dim": 36,
                    "depth": DEPTH,
                    "num_heads": 3,
                    "mlp_ratio": 2.5,
                    "patch_size": PATCH,
                    "class_token": False,
                },
            },
            "image_sizes": [IMAGE, IMAGE],
            "text_config": self.llm.config.to_dict(),
            "n_action_bins": BINS,
            "pad_to_multiple_of": PAD_ROWS,
            "norm_stats": {"tiny": {"action": {"q01": Q01, "q99": Q99, "mask": MASK}}},
        }


def write_standin(path, seed=0) -> TorchOpenVLA:
    """Write the stand-in checkpoint directory to ``path``; returns its torch reference."""
    ref = TorchOpenVLA(seed)
    save_file(ref.checkpoint(), str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(ref.config()))
    return ref
