"""Writes lerobot's GR00T-N1.5 (``lerobot.policies.groot``: the Eagle-2.5-VL backbone and
``FlowmatchingActionHead``) at a small random size, with inputs and its outputs, for
``tests/test_gr00t.py`` to compare against.

Runs under the reference environment (``tests/reference/lerobot_env.py`` builds it), never
under ours:

    $(python tests/reference/lerobot_env.py) tests/reference/lerobot_gr00t.py OUT_DIR

lerobot's ``EagleBackbone`` reads the Eagle config from the hub's processor repository and
``GR00TN15`` loads published weights, so the script assembles the same modules from their
config classes at small sizes: ``Eagle25VLForConditionalGeneration`` (a SigLIP tower and a
Qwen3 LM, eager attention where GR00T asks for flash attention, which has no CPU kernel),
an ``EagleBackbone`` around it with the LM cut to ``select_layer`` layers as its constructor
cuts it, and ``FlowmatchingActionHead``. Every forward pass is lerobot's own code, in eval
mode (no dropout). The published options are kept: no pixel shuffle, a one-layer
connector, no projection after the LM, interleaved self-attention in the DiT, no sinusoidal
positions. A second small Eagle with pixel shuffle and the two-layer connector is written
beside it (``shuffle/``) for the backbone's other path.

OUT_DIR gets ``config.json`` (GR00T-N1.5's keys; ``backbone_cfg.eagle_config`` holds the
small Eagle's config, which a published checkpoint takes from the hub instead),
``model.safetensors`` (``GR00TN15``'s keys: ``backbone.*``, ``action_head.*``; tied tensors
once) and ``io.npz``: pixels, prompt, state, embodiment ids, noise, times and actions in;
out the backbone features before and after the action head's feature stack, one velocity
at per-row times, the training loss at fixed noise and times, and a 4-step sample.

With ``--count``, it instead reads ``{"eagle": ..., "gr00t": ...}`` (an Eagle config and a
GR00T config.json, as JSON on stdin), builds lerobot's modules at those sizes on torch's
meta device and prints their parameter count: how the published size is checked.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import torch
from safetensors.torch import save_model
from transformers import Qwen3Config, Qwen3ForCausalLM, SiglipVisionConfig, SiglipVisionModel
from transformers.feature_extraction_utils import BatchFeature

import lerobot
import transformers
from lerobot.policies.groot.action_head.flow_matching_action_head import (
    FlowmatchingActionHead,
    FlowmatchingActionHeadConfig,
)
from lerobot.policies.groot.eagle2_hg_model.configuration_eagle2_5_vl import Eagle25VLConfig
from lerobot.policies.groot.eagle2_hg_model.modeling_eagle2_5_vl import Eagle25VLForConditionalGeneration
from lerobot.policies.groot.groot_n1 import EagleBackbone

VOCAB, IMAGE_TOKEN = 300, 299
IMAGE, CAMERAS, SELECT = 56, 2, 2
VISION = {"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
          "num_attention_heads": 2, "patch_size": 14, "image_size": IMAGE}
TEXT = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": VOCAB, "hidden_size": 48,
        "intermediate_size": 80, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
        "max_position_embeddings": 512}
HEAD = {"action_dim": 6, "action_horizon": 5, "hidden_size": 40, "input_embedding_dim": 32,
        "backbone_embedding_dim": 48, "max_state_dim": 8, "max_num_embodiments": 3, "num_target_vision_tokens": 4,
        "max_seq_len": 16, "add_pos_embed": True, "use_vlln": True, "num_inference_timesteps": 4,
        "noise_beta_alpha": 1.5, "noise_beta_beta": 1.0, "noise_s": 0.999, "num_timestep_buckets": 1000,
        "diffusion_model_cfg": {"num_layers": 4, "num_attention_heads": 2, "attention_head_dim": 16,
                                "output_dim": 40, "cross_attention_dim": 48, "interleave_self_attention": True,
                                "norm_type": "ada_norm", "positional_embeddings": None, "dropout": 0.2,
                                "final_dropout": True},
        "vl_self_attention_cfg": {"num_layers": 2, "num_attention_heads": 2, "attention_head_dim": 24,
                                  "positional_embeddings": None, "dropout": 0.2, "final_dropout": True}}


def eagle_config(shuffle: bool) -> dict:
    return {"vision_config": VISION, "text_config": TEXT, "select_layer": -1, "image_token_index": IMAGE_TOKEN,
            "force_image_size": IMAGE, "use_pixel_shuffle": shuffle, "downsample_ratio": 0.5,
            "mlp_connector_layers": 2 if shuffle else 1}


def backbone(eagle_cfg: dict, select: int) -> EagleBackbone:
    """lerobot's ``EagleBackbone`` around an Eagle of ``eagle_cfg``'s sizes (module docstring)."""
    config = Eagle25VLConfig(**eagle_cfg, _attn_implementation="eager")
    vision = SiglipVisionConfig(**{k: v for k, v in eagle_cfg["vision_config"].items() if k != "model_type"})
    vision._attn_implementation = "eager"
    text = Qwen3Config(**{k: v for k, v in eagle_cfg["text_config"].items()
                          if k not in ("architectures", "model_type")})
    text._attn_implementation = "eager"
    eagle = Eagle25VLForConditionalGeneration(config, vision_model=SiglipVisionModel(vision),
                                              language_model=Qwen3ForCausalLM(text))
    module = EagleBackbone.__new__(EagleBackbone)
    torch.nn.Module.__init__(module)
    module.eagle_model = eagle
    module.eagle_linear = torch.nn.Identity()  # project_to_dim=None, as published
    while len(eagle.language_model.model.layers) > select:  # EagleBackbone.__init__'s cut
        eagle.language_model.model.layers.pop(-1)
    module.select_layer = select
    module.set_trainable_parameters(tune_llm=False, tune_visual=False)
    return module.eval()


def randomize(model, seed):
    """Every floating parameter random: norm weights around 1, the rest around 0."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.state_dict().items():
            if p.is_floating_point():
                norm = ("norm" in name or "vlln" in name or "mlp1.0" in name) and name.endswith("weight")
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2 + (1.0 if norm else 0.0))


def prompt(gen, B, tokens_per_image):
    """Right-padded prompts: every camera's image tokens, then text."""
    images = CAMERAS * tokens_per_image
    text = torch.randint(1, VOCAB - 1, (B, 6), generator=gen)
    ids = torch.cat([torch.full((B, images), IMAGE_TOKEN), text], dim=1)
    mask = torch.ones_like(ids)
    ids[1, images + 3:] = 0
    mask[1, images + 3:] = 0
    return ids, mask


def main(out: Path) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(1)
    B = 3

    model = torch.nn.Module()  # GR00TN15's layout: backbone, action_head
    model.backbone = backbone(eagle_config(False), SELECT)
    model.action_head = FlowmatchingActionHead(FlowmatchingActionHeadConfig(**HEAD)).eval()
    randomize(model, 0)
    head = model.action_head
    H, A = HEAD["action_horizon"], HEAD["action_dim"]

    pixels = torch.rand(B, CAMERAS, 3, IMAGE, IMAGE, generator=gen) * 2 - 1
    ids, mask = prompt(gen, B, (IMAGE // 14) ** 2)
    vl_input = BatchFeature({"eagle_pixel_values": pixels.reshape(B * CAMERAS, 3, IMAGE, IMAGE),
                             "eagle_input_ids": ids, "eagle_attention_mask": mask, "eagle_image_sizes": None})
    state = torch.randn(B, 1, HEAD["max_state_dim"], generator=gen)
    embodiment = torch.tensor([0, 2, 1])
    noise = torch.randn(B, H, A, generator=gen)
    actions = torch.randn(B, H, A, generator=gen)
    action_mask = torch.ones(B, H, A)
    action_mask[:, :, A - 2:] = 0  # the padded action dimensions, as lerobot masks them
    s_loss = torch.tensor([0.05, 0.5, 0.93])
    s_step = torch.tensor([0.0, 0.25, 0.7])
    x = torch.randn(B, H, A, generator=gen)

    with torch.no_grad():
        features = model.backbone(vl_input)
        raw = features["backbone_features"].clone()
        action_input = BatchFeature({"state": state, "embodiment_id": embodiment, "action": actions,
                                     "action_mask": action_mask})
        head.sample_time = lambda batch_size, device, dtype: s_loss.clone()
        with mock.patch.object(torch, "randn", lambda *a, **k: noise.clone()):
            loss = head(BatchFeature(dict(features)), action_input)["loss"]
            sample = head.get_action(BatchFeature(dict(features)), action_input)["action_pred"]
        processed = head.process_backbone_output(BatchFeature(dict(features)))["backbone_features"]
        # One velocity at per-row times, with the head's own modules as get_action runs them.
        steps = (s_step * HEAD["num_timestep_buckets"]).long()
        encoded = head.action_encoder(x, steps, embodiment) + head.position_embedding(torch.arange(H))[None]
        tokens = torch.cat([head.state_encoder(state, embodiment),
                            head.future_tokens.weight[None].expand(B, -1, -1), encoded], dim=1)
        velocity = head.action_decoder(head.model(hidden_states=tokens, encoder_hidden_states=processed,
                                                  timestep=steps), embodiment)[:, -H:]

        shuffled = backbone(eagle_config(True), SELECT)
        randomize(shuffled, 2)
        ids_s, mask_s = prompt(gen, B, (IMAGE // 14) ** 2 // 4)
        shuffle_features = shuffled(BatchFeature({
            "eagle_pixel_values": pixels.reshape(B * CAMERAS, 3, IMAGE, IMAGE), "eagle_input_ids": ids_s,
            "eagle_attention_mask": mask_s, "eagle_image_sizes": None}))["backbone_features"]

    out.mkdir(parents=True, exist_ok=True)
    save_model(model, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps({
        "model_type": "gr00t_n1_5", "architectures": ["GR00T_N1_5"],
        "action_horizon": H, "action_dim": A, "compute_dtype": "float32",
        "backbone_cfg": {"select_layer": SELECT, "project_to_dim": None, "eagle_config": eagle_config(False)},
        "action_head_cfg": HEAD,
        "reference": {"lerobot": lerobot.__version__, "torch": torch.__version__,
                      "transformers": transformers.__version__},
    }, indent=1))
    shuffle_dir = out / "shuffle"
    shuffle_dir.mkdir(exist_ok=True)
    holder = torch.nn.Module()
    holder.backbone = shuffled
    save_model(holder, str(shuffle_dir / "model.safetensors"))
    (shuffle_dir / "eagle_config.json").write_text(json.dumps(eagle_config(True), indent=1))
    np.savez(out / "io.npz", **{
        "pixels": pixels.permute(0, 1, 3, 4, 2).numpy(),  # [B, cameras, H, W, 3]
        "input_ids": ids.numpy(), "attention_mask": mask.numpy(),
        "state": state[:, 0].numpy(), "embodiment": embodiment.numpy(),
        "noise": noise.numpy(), "actions": actions.numpy(), "action_mask": action_mask.numpy(),
        "s_loss": s_loss.numpy(), "s_step": s_step.numpy(), "x": x.numpy(),
        "backbone_features": raw.numpy(), "processed_features": processed.numpy(),
        "velocity": velocity.numpy(), "loss": loss.numpy(), "sample": sample.numpy(),
        "shuffle_input_ids": ids_s.numpy(), "shuffle_attention_mask": mask_s.numpy(),
        "shuffle_features": shuffle_features.numpy(),
    })


def count() -> int:
    """Parameters of lerobot's GR00T modules at the sizes given on stdin (module docstring)."""
    sizes = json.load(sys.stdin)
    torch.distributions.Distribution.set_default_validate_args(False)  # Beta's check reads values
    with torch.device("meta"):
        model = torch.nn.Module()
        model.backbone = backbone(sizes["eagle"], sizes["gr00t"]["backbone_cfg"]["select_layer"])
        model.action_head = FlowmatchingActionHead(FlowmatchingActionHeadConfig(**sizes["gr00t"]["action_head_cfg"]))
    return sum(p.numel() for p in model.parameters())


if __name__ == "__main__":
    if sys.argv[1:] == ["--count"]:
        print(count())
    elif len(sys.argv) == 2:
        main(Path(sys.argv[1]))
    else:
        sys.exit("usage: lerobot_gr00t.py OUT_DIR | lerobot_gr00t.py --count < SIZES.json")
