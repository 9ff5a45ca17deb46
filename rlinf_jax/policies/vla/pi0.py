"""pi0: flow-matching action chunks from a PaliGemma prefix and a Gemma action expert.

Two transformers share attention, layer by layer. The prefix (images + prompt) runs through
PaliGemma's Gemma once, bidirectionally, and leaves its keys / values in a KV cache. The
suffix, one state token and ``H`` noisy-action tokens (each mixed with a sinusoidal
embedding of the flow time), runs through a smaller Gemma, the action expert, whose layer
``l`` attends over its own keys and over the prefix's layer-``l`` keys (both stacks must
agree on layers, KV heads and head_dim). The state token sees the prefix and itself, the
action tokens see everything; the prefix never sees the suffix, which is why its cache is
computed once and reused by all ``N`` denoising steps (transformers' ``PI0Model`` does the
same with a cropped ``DynamicCache``; openpi with its two-expert Gemma).

The flow convention, sampling, the RL chains (flow-SDE, flow-noise) and the loss are
`FlowModel`'s (`policies.vla.flow_model`), shared with pi0.5. The value head reads the
expert's output at the state token: that token attends only to the prefix and itself, so its
value is a function of the observation alone, the same at every denoising step.

Shapes: ``B`` batch, ``P`` prefix tokens, ``H`` = ``chunk_size``, ``A`` = ``max_action_dim``,
``E`` expert width. Images are ``[B, cameras, H_img, W_img, C]``, channels last.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm.config import LMConfig
from rlinf_jax.policies.lm.layers import Dense
from rlinf_jax.policies.vla.flow_model import (
    FlowModel,
    FlowSample,
    Prefix,
    check_flow_config,
    flow_fields,
    time_embedding,
)
from rlinf_jax.policies.vla.paligemma import PaliGemmaConfig

__all__ = ["FlowSample", "Pi0", "Pi0Config", "Prefix", "time_embedding"]

# transformers' PI0Config defaults for the action expert (openpi's gemma_300m).
_EXPERT_DEFAULTS = {
    "model_type": "gemma",
    "hidden_size": 1024,
    "num_hidden_layers": 18,
    "intermediate_size": 4096,
    "num_attention_heads": 8,
    "num_key_value_heads": 1,
    "head_dim": 256,
}


@dataclasses.dataclass(frozen=True)
class Pi0Config:
    paligemma: PaliGemmaConfig
    expert: LMConfig
    chunk_size: int = 50
    max_state_dim: int = 32
    max_action_dim: int = 32
    num_steps: int = 10
    min_period: float = 4e-3  # sinusoidal time embedding periods
    max_period: float = 4.0
    # RL heads, absent from torch checkpoints (fresh when converted); () = no head.
    value_hidden: tuple[int, ...] = ()  # MLP widths of the value head on the state token
    noise_hidden: tuple[int, ...] = ()  # MLP widths of the flow-noise std head
    noise_std_range: tuple[float, float] = (0.08, 0.16)

    def __post_init__(self):
        check_flow_config(self)

    @classmethod
    def from_hf_config(cls, hf: dict, **rl) -> Pi0Config:
        """Read a ``PI0ForConditionalGeneration`` config.json dict; ``rl`` sets the RL-head
        fields (``value_hidden``, ``noise_hidden``, ``noise_std_range``)."""
        if hf.get("model_type") != "pi0":
            raise BadInput(f"config.json model_type={hf.get('model_type')!r} is not 'pi0'")
        paligemma = PaliGemmaConfig.from_hf_config({"model_type": "paligemma", **hf.get("vlm_config", {})})
        expert = {**_EXPERT_DEFAULTS, "vocab_size": paligemma.text.vocab_size, **hf.get("dit_config", {})}
        return cls(paligemma, LMConfig.from_hf_config(expert), **flow_fields(hf), **rl)


class Pi0(FlowModel):
    """pi0 (``PI0ForConditionalGeneration``) plus optional RL heads; see the module docstring."""

    def __init__(self, config: Pi0Config, *, dtype=jnp.float32, param_dtype=None, rngs: nnx.Rngs,
                 scan_layers: bool = False, remat: str = "none"):
        # The expert's tokens: the state token and the actions.
        kw = self._build_towers(config, 1 + config.chunk_size, dtype=dtype, param_dtype=param_dtype, rngs=rngs,
                                scan_layers=scan_layers, remat=remat)
        c, E = config, config.expert.hidden_size
        dense = {"use_bias": True, **kw}
        self.state_proj = Dense(c.max_state_dim, E, (None, "embed"), **dense)
        self.action_in_proj = Dense(c.max_action_dim, E, (None, "embed"), **dense)
        self.action_time_mlp_in = Dense(2 * E, E, (None, "embed"), **dense)
        self.action_time_mlp_out = Dense(E, E, ("embed", None), **dense)
        self.action_out_proj = Dense(E, c.max_action_dim, ("embed", None), **dense)
        self._build_rl_heads(c, E, **kw)  # the value head reads the state token

    # -- suffix ------------------------------------------------------------------------

    def embed_suffix(self, state: jax.Array, x_t: jax.Array, t: jax.Array) -> jax.Array:
        """State token and action-time tokens ``[B, 1 + H, E]`` from ``state [B, S_dim]``,
        ``x_t [B, H, A]`` and ``t [B]``."""
        c = self.config
        B, H, A = x_t.shape
        E = c.expert.hidden_size
        actions = self.action_in_proj(x_t.reshape(B * H, A))
        times = time_embedding(t, E, c.min_period, c.max_period).astype(actions.dtype)
        times = jnp.broadcast_to(times[:, None, :], (B, H, E)).reshape(B * H, E)
        mixed = self.action_time_mlp_out(jax.nn.silu(self.action_time_mlp_in(jnp.concatenate([actions, times], -1))))
        state_token = self.state_proj(state)[:, None, :]
        return jnp.concatenate([state_token, mixed.reshape(B, H, E)], axis=1)

    def expert_hidden(self, prefix: Prefix, state, x_t, t) -> jax.Array:
        """The action expert's final-norm output ``[B, 1 + H, E]`` (state token first)."""
        L = 1 + self.config.chunk_size
        # The state token (row 0) sees the prefix and itself; action tokens see everything.
        rows, cols = jnp.arange(L)[:, None], jnp.arange(L)[None, :]
        return self.run_expert(prefix, self.embed_suffix(state, x_t, t), (rows >= 1) | (cols == 0))

    def outputs(self, prefix: Prefix, state, x_t, t):
        """(velocity, noise std or None, value): the actions' outputs through the heads, the
        value head on the state token's."""
        hidden = self.expert_hidden(prefix, state, x_t, t)
        v, std = self.action_heads(hidden[:, 1:])
        return v, std, self.value_of(hidden[:, 0])
