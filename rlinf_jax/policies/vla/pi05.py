"""pi0.5: pi0's two transformers with the state in the prompt and the flow time in the norms.

What differs from pi0 (`policies.vla.pi0`), and nothing else does:

- **No state token.** The robot state enters the prefix as text: each dimension, normalised
  to [-1, 1], is cut into 256 bins and written into the prompt (``discretize_state``), so
  the expert's suffix is the ``H`` noisy-action tokens alone, bidirectional among
  themselves and over the prefix.
- **Time through adaptive norms.** The flow time's sinusoidal embedding goes through
  ``time_mlp_in -> silu -> time_mlp_out -> silu`` and conditions every RMSNorm of the action
  expert (`policies.lm.layers.AdaRMSNorm`: scale, shift and a residual gate from a dense
  layer) instead of being concatenated with the action tokens.
- **Published sizes**: the PaliGemma prefix (SigLIP so400m/14 and Gemma 2B) and a Gemma
  300M expert, named by openpi's variant strings in the checkpoint's config.json.

The value head (RL only) reads the mean of the prefix's final hidden states over its real
tokens, as RLinf's pi0.5 critic does (``value_after_vlm``): with no state token, that is the
expert-free summary of the observation, the same at every denoising step. Sampling, the RL
chains and the flow-matching loss are `FlowModel`'s.

Shapes: ``B`` batch, ``P`` prefix tokens, ``H`` = ``chunk_size``, ``A`` = ``max_action_dim``,
``E`` expert width, ``D`` PaliGemma width.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm.config import LMConfig
from rlinf_jax.policies.lm.layers import Dense
from rlinf_jax.policies.vla.flow_model import FlowModel, Prefix, check_flow_config, flow_fields, time_embedding
from rlinf_jax.policies.vla.paligemma import PaliGemmaConfig

# openpi's Gemma variants, by the names a pi0.5 config.json gives (``paligemma_variant``,
# ``action_expert_variant``).
GEMMA_VARIANTS = {
    "gemma_300m": {"width": 1024, "depth": 18, "mlp_dim": 4096, "num_heads": 8, "num_kv_heads": 1, "head_dim": 256},
    "gemma_2b": {"width": 2048, "depth": 18, "mlp_dim": 16384, "num_heads": 8, "num_kv_heads": 1, "head_dim": 256},
}
# PaliGemma's SigLIP so400m/14 and vocabulary, as openpi and lerobot build pi0.5's prefix
# (the image size is the config's ``image_resolution``).
SIGLIP_SO400M = {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27,
                 "num_attention_heads": 16, "patch_size": 14}
PALIGEMMA_VOCAB = 257152
STATE_BINS = 256  # openpi's PaligemmaTokenizer: the state's [-1, 1] cut into 256 bins


def discretize_state(state: jax.Array, bins: int = STATE_BINS) -> jax.Array:
    """``state [..., S]`` in [-1, 1] -> int32 bins in ``0 .. bins - 1``: the bin ``i`` with
    ``edge_i <= x < edge_{i+1}`` of ``bins`` equal bins over [-1, 1] (``np.digitize`` over
    the left edges, minus one, as openpi writes the state into pi0.5's prompt); values
    outside the range go to the end bins."""
    edges = jnp.asarray(np.linspace(-1.0, 1.0, bins + 1)[:-1], jnp.float32)
    index = jnp.searchsorted(edges, state.astype(jnp.float32), side="right") - 1
    return jnp.clip(index, 0, bins - 1).astype(jnp.int32)


def _gemma(variant, vocab_size: int, adarms: bool, what: str) -> LMConfig:
    """An LMConfig from an openpi variant name or a dict of its fields (small checkpoints)."""
    if isinstance(variant, str):
        if variant not in GEMMA_VARIANTS:
            raise BadInput(f"config.json {what}={variant!r} is not one of {', '.join(GEMMA_VARIANTS)}")
        variant = GEMMA_VARIANTS[variant]
    need = ("width", "depth", "mlp_dim", "num_heads", "num_kv_heads", "head_dim")
    missing = [k for k in need if k not in variant]
    if missing:
        raise BadInput(f"config.json {what} lacks {', '.join(missing)} (give a variant name or all of {need})")
    return LMConfig.from_hf_config({
        "model_type": "gemma",
        "vocab_size": int(variant.get("vocab_size", vocab_size)),
        "hidden_size": variant["width"],
        "intermediate_size": variant["mlp_dim"],
        "num_hidden_layers": variant["depth"],
        "num_attention_heads": variant["num_heads"],
        "num_key_value_heads": variant["num_kv_heads"],
        "head_dim": variant["head_dim"],
        "hidden_activation": "gelu_pytorch_tanh",
        **({"use_adarms": True, "adarms_cond_dim": variant["width"]} if adarms else {}),
    })


@dataclasses.dataclass(frozen=True)
class Pi05Config:
    paligemma: PaliGemmaConfig
    expert: LMConfig  # adaptive norms conditioned on the time embedding (adarms_cond_dim = width)
    chunk_size: int = 50
    max_state_dim: int = 32  # state dimensions written into the prompt (the prompt builder's)
    max_action_dim: int = 32
    num_steps: int = 10
    min_period: float = 4e-3
    max_period: float = 4.0
    # RL heads, absent from torch checkpoints (fresh when converted); () = no head.
    value_hidden: tuple[int, ...] = ()  # MLP widths of the value head on the pooled prefix
    noise_hidden: tuple[int, ...] = ()  # MLP widths of the flow-noise std head
    noise_std_range: tuple[float, float] = (0.08, 0.16)

    def __post_init__(self):
        check_flow_config(self)
        if self.expert.adarms_cond_dim != self.expert.hidden_size:
            raise BadInput(
                f"pi0.5's action expert conditions its norms on the time embedding of its own width "
                f"({self.expert.hidden_size}), not {self.expert.adarms_cond_dim}"
            )

    @classmethod
    def from_lerobot_config(cls, hf: dict, **rl) -> Pi05Config:
        """Read a pi0.5 ``config.json`` (lerobot's ``PI05Config``, ``"type": "pi05"``). The two
        variants are openpi's names or, for small checkpoints, dicts of their fields (``width``,
        ``depth``, ``mlp_dim``, ``num_heads``, ``num_kv_heads``, ``head_dim``, optionally
        ``vocab_size``); an optional ``vision_config`` dict overrides SigLIP so400m's sizes.
        ``rl`` sets the RL-head fields."""
        if hf.get("type") != "pi05":
            raise BadInput(f"config.json type={hf.get('type')!r} is not 'pi05'")
        resolution = hf.get("image_resolution", [224, 224])
        if len(resolution) != 2 or resolution[0] != resolution[1]:
            raise BadInput(f"config.json image_resolution={resolution} must be square, as PaliGemma's")
        text = _gemma(hf.get("paligemma_variant", "gemma_2b"), PALIGEMMA_VOCAB, False, "paligemma_variant")
        expert = _gemma(hf.get("action_expert_variant", "gemma_300m"), PALIGEMMA_VOCAB, True,
                        "action_expert_variant")
        vision = {"model_type": "siglip_vision_model", **SIGLIP_SO400M, "image_size": int(resolution[0]),
                  "vision_use_head": False, **hf.get("vision_config", {})}
        paligemma = PaliGemmaConfig.from_hf_config({
            "model_type": "paligemma",
            "text_config": {**text.to_hf_config(), "hidden_activation": "gelu_pytorch_tanh"},
            "vision_config": vision,
            "projection_dim": text.hidden_size,
            "image_token_index": text.vocab_size,  # outside the vocabulary, as openpi's
        })
        return cls(paligemma, expert, **flow_fields(hf), **rl)


class Pi05(FlowModel):
    """pi0.5 (openpi / lerobot ``PI05Pytorch``) plus optional RL heads; see the module docstring."""

    def __init__(self, config: Pi05Config, *, dtype=jnp.float32, param_dtype=None, rngs: nnx.Rngs,
                 scan_layers: bool = False, remat: str = "none"):
        # The expert's tokens: the actions alone.
        kw = self._build_towers(config, config.chunk_size, dtype=dtype, param_dtype=param_dtype, rngs=rngs,
                                scan_layers=scan_layers, remat=remat)
        c, E = config, config.expert.hidden_size
        dense = {"use_bias": True, **kw}
        self.action_in_proj = Dense(c.max_action_dim, E, (None, "embed"), **dense)
        self.time_mlp_in = Dense(E, E, ("embed", None), **dense)
        self.time_mlp_out = Dense(E, E, (None, "embed"), **dense)
        self.action_out_proj = Dense(E, c.max_action_dim, ("embed", None), **dense)
        self._build_rl_heads(c, c.paligemma.text.hidden_size, **kw)  # the value head reads the pooled prefix

    def time_condition(self, t: jax.Array) -> jax.Array:
        """``t [B]`` -> the expert's norm conditioning ``[B, E]``."""
        c = self.config
        # The torch ports' float64 angles: pi0.5's checkpoints are converted from them.
        emb = time_embedding(t, c.expert.hidden_size, c.min_period, c.max_period, exact=True)
        return jax.nn.silu(self.time_mlp_out(jax.nn.silu(self.time_mlp_in(emb))))

    def expert_hidden(self, prefix: Prefix, x_t: jax.Array, t: jax.Array) -> jax.Array:
        """The action expert's final-norm output ``[B, H, E]`` at ``x_t [B, H, A]``, ``t [B]``."""
        B, H, A = x_t.shape
        actions = self.action_in_proj(x_t.reshape(B * H, A)).reshape(B, H, -1)
        return self.run_expert(prefix, actions, jnp.ones((H, H), bool), cond=self.time_condition(t))

    def outputs(self, prefix: Prefix, state, x_t, t):
        """(velocity, noise std or None, value). ``state`` is not read: pi0.5 has it in the
        prompt (`discretize_state`)."""
        del state
        v, std = self.action_heads(self.expert_hidden(prefix, x_t, t))
        return v, std, self.value_of(prefix.pooled)
