"""Writes lerobot's pi0.5 (``lerobot.policies.pi05.modeling_pi05.PI05Pytorch``) at a small
random size, with inputs and its outputs, for ``tests/test_pi05.py`` to compare against.

Runs under the reference environment (``tests/reference/lerobot_env.py`` builds it: lerobot
0.4.4, torch 2.10, openpi's transformers 4.53.3), never under ours:

    $(python tests/reference/lerobot_env.py) tests/reference/lerobot_pi05.py OUT_DIR

lerobot builds pi0.5 only at its published sizes (openpi's ``gemma_2b`` / ``gemma_300m``
variants, SigLIP so400m, a 257152-token vocabulary). The script swaps those size tables for
small ones before the model is built (``get_gemma_config``, the PaliGemma and Gemma configs
it constructs); every layer, norm and forward pass is lerobot's own code. lerobot's joint
attention reshapes to 8 heads, so both Gemmas keep 8 query heads.

OUT_DIR gets ``config.json`` (lerobot's pi0.5 keys; the variants as dicts of their sizes),
``model.safetensors`` (saved as lerobot saves a policy: ``model.`` before PI05Pytorch's own
keys, tied tensors once) and ``io.npz``: images, masks, tokens, noise, times and actions in;
out the velocity of one denoising step, the flow-matching loss of the training forward pass,
a full 4-step sample from fixed noise and the time embeddings.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_model

import lerobot
import lerobot.policies.pi05.modeling_pi05 as pi05
import transformers
from lerobot.policies.pi05.configuration_pi05 import PI05Config

VOCAB = 301
PREFIX = {"width": 64, "depth": 2, "mlp_dim": 96, "num_heads": 8, "num_kv_heads": 1, "head_dim": 8}
EXPERT = {"width": 32, "depth": 2, "mlp_dim": 48, "num_heads": 8, "num_kv_heads": 1, "head_dim": 8}
VISION = {"hidden_size": 48, "intermediate_size": 72, "num_hidden_layers": 2, "num_attention_heads": 3,
          "patch_size": 14}
IMAGE, CHUNK, ACTION_DIM, STEPS = 28, 5, 4, 4


def small_sizes():
    """Points lerobot's size tables at the small model (module docstring)."""
    sizes = {"gemma_2b": PREFIX, "gemma_300m": EXPERT}
    pi05.get_gemma_config = lambda variant: pi05.GemmaConfig(**sizes[variant])
    paligemma_cls = pi05.PaliGemmaForConditionalGeneration
    gemma_cls = pi05.GemmaForCausalLM

    def paligemma(config):
        for key, value in VISION.items():
            setattr(config.vision_config, key, value)
        config.vision_config.projection_dim = config.text_config.hidden_size
        config.text_config.vocab_size = VOCAB
        config._vocab_size = VOCAB
        config.image_token_index = VOCAB
        return paligemma_cls(config=config)

    def gemma(config):
        config.vocab_size = VOCAB
        return gemma_cls(config=config)

    pi05.PaliGemmaForConditionalGeneration = paligemma
    pi05.GemmaForCausalLM = gemma


def randomize(model, seed):
    """Every floating parameter random (LayerNorm weights around 1, the rest around 0), the
    adaptive norms' dense layers included (lerobot starts them at zero)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.state_dict().items():
            if p.is_floating_point():
                layer_norm = ("layer_norm" in name or "layernorm" in name) and name.endswith("weight") \
                    and ".dense." not in name
                p.copy_(torch.randn(p.shape, generator=gen) * 0.25 + (1.0 if layer_norm else 0.0))


def main(out: Path) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    small_sizes()
    config = PI05Config(chunk_size=CHUNK, n_action_steps=CHUNK, max_action_dim=ACTION_DIM, max_state_dim=6,
                        num_inference_steps=STEPS, image_resolution=(IMAGE, IMAGE), dtype="float32", device="cpu")
    model = pi05.PI05Pytorch(config).eval()
    randomize(model, 0)

    gen = torch.Generator().manual_seed(1)
    B, L = 2, 7
    images = [torch.rand(B, 3, IMAGE, IMAGE, generator=gen) * 2 - 1 for _ in range(2)]
    img_masks = [torch.tensor([True, True]), torch.tensor([True, False])]  # row 1 lacks camera 2
    tokens = torch.randint(1, VOCAB, (B, L), generator=gen)
    masks = torch.ones(B, L, dtype=torch.bool)
    masks[1, 4:] = False  # right padding, as lerobot's tokenizer step pads
    tokens[1, 4:] = 0
    noise = torch.randn(B, CHUNK, ACTION_DIM, generator=gen)
    actions = torch.randn(B, CHUNK, ACTION_DIM, generator=gen)
    time = torch.tensor([0.3, 0.85])
    x_t = torch.randn(B, CHUNK, ACTION_DIM, generator=gen)

    with torch.no_grad():
        loss = model.forward(images, img_masks, tokens, masks, actions, noise=noise, time=time)
        sample = model.sample_actions(images, img_masks, tokens, masks, noise=noise, num_steps=STEPS)
        # One denoising step at (x_t, time) over the prefix's cache, as sample_actions runs it.
        embs, pad, att = model.embed_prefix(images, img_masks, tokens, masks)
        att_2d = pi05.make_att_2d_masks(pad, att)
        _, cache = model.paligemma_with_expert.forward(
            attention_mask=model._prepare_attention_masks_4d(att_2d), position_ids=torch.cumsum(pad, 1) - 1,
            past_key_values=None, inputs_embeds=[embs, None], use_cache=True)
        velocity = model.denoise_step(pad, cache, x_t, time)
        times = torch.tensor([0.0, 0.001, 0.37, 1.0])
        time_emb = pi05.create_sinusoidal_pos_embedding(times, EXPERT["width"], config.min_period,
                                                        config.max_period, device=times.device)

    out.mkdir(parents=True, exist_ok=True)
    holder = torch.nn.Module()
    holder.model = model  # lerobot's PI05Policy holds the core as `model`
    save_model(holder, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps({
        "type": "pi05",
        "paligemma_variant": {**PREFIX, "vocab_size": VOCAB},
        "action_expert_variant": {**EXPERT, "vocab_size": VOCAB},
        "vision_config": VISION,
        "chunk_size": CHUNK, "n_action_steps": CHUNK, "max_state_dim": 6, "max_action_dim": ACTION_DIM,
        "num_inference_steps": STEPS, "image_resolution": [IMAGE, IMAGE],
        "min_period": config.min_period, "max_period": config.max_period,
        "reference": {"lerobot": lerobot.__version__, "torch": torch.__version__,
                      "transformers": transformers.__version__},
    }, indent=1))
    arrays = {
        "images": np.stack([i.numpy() for i in images], 1),  # [B, cameras, 3, H, W]
        "img_masks": np.stack([m.numpy() for m in img_masks], 1),
        "tokens": tokens.numpy(), "masks": masks.numpy(),
        "noise": noise.numpy(), "actions": actions.numpy(), "time": time.numpy(), "x_t": x_t.numpy(),
        "loss": loss.numpy(), "sample": sample.numpy(), "velocity": velocity.numpy(),
        "emb_times": times.numpy(), "time_emb": time_emb.numpy(),
    }
    np.savez(out / "io.npz", **arrays)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: lerobot_pi05.py OUT_DIR")
    main(Path(sys.argv[1]))
