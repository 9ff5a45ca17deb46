"""OpenVLA-OFT-style parallel decoding: a whole action chunk from one forward pass.

After the multimodal prompt (``OpenVLA.multimodal_inputs``) come ``chunk * action_dim``
action slots, one per scalar of the chunk, laid out step-major (``slot = step * action_dim
+ dim``). Slot inputs are a learned embedding per slot, initialised to zero as OFT's
placeholder embeddings are (slots then differ only by their rotary positions). Attention:
prompt tokens are causal and never see the slots; every slot sees the real prompt tokens
and all the slots (bidirectional), so the chunk is predicted jointly, not token by token.

Two heads read the slots' final hidden states:
- ``discrete``: the LM head's logits restricted to the action ids, one token per slot
  (OpenVLA's binning); chunk log-probs are the sums of the slots' restricted log-probs.
- ``continuous``: OFT's L1 regression head, an MLP-ResNet over each step's
  ``action_dim`` slot states concatenated, giving normalised actions directly (trained with
  an L1 loss). For RL it is read as the mean of a Gaussian with a learned per-dimension
  log-std (our addition; OFT itself is not trained with RL), chunk log-probs summing over
  steps and dimensions.

The value head's input is the hidden state of the last prompt token, as for OpenVLA.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm.layers import Dense, param
from rlinf_jax.policies.vla import action_tokens as at
from rlinf_jax.policies.vla.openvla import OpenVLA
from rlinf_jax.policies.vla.vit import LayerNorm

HEADS = ("discrete", "continuous")


@dataclasses.dataclass(frozen=True)
class OFTConfig:
    chunk: int = 8
    action_dim: int = 7
    head: str = "discrete"
    resnet_blocks: int = 2  # continuous head: MLP-ResNet blocks
    init_log_std: float = -1.0  # continuous head: initial Gaussian log-std for RL

    def __post_init__(self):
        if self.head not in HEADS:
            raise BadInput(f"OFT head {self.head!r} is unknown; choose one of {', '.join(HEADS)}")
        if self.chunk < 1 or self.action_dim < 1:
            raise BadInput(f"OFT chunk={self.chunk} and action_dim={self.action_dim} must be positive")

    @property
    def num_slots(self) -> int:
        return self.chunk * self.action_dim


class L1RegressionHead(nnx.Module):
    """OFT's MLP-ResNet: ``norm -> fc1 -> ReLU -> [x + ReLU(W norm(x))] * n -> norm -> fc2``
    from ``action_dim * hidden`` features (one step's slots) to ``action_dim`` values."""

    def __init__(self, hidden: int, action_dim: int, blocks: int, *, dtype, param_dtype, rngs):
        kw = {"dtype": dtype, "param_dtype": param_dtype, "rngs": rngs}
        d_in = hidden * action_dim
        self.norm_in = LayerNorm(d_in, eps=1e-5, **kw)
        self.fc1 = Dense(d_in, hidden, (None, "embed"), use_bias=True, **kw)
        self.block_norms = nnx.List([LayerNorm(hidden, eps=1e-5, **kw) for _ in range(blocks)])
        self.block_fcs = nnx.List([Dense(hidden, hidden, (None, "embed"), use_bias=True, **kw) for _ in range(blocks)])
        self.norm_out = LayerNorm(hidden, eps=1e-5, **kw)
        self.fc2 = Dense(hidden, action_dim, ("embed", None), use_bias=True, **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        lead = x.shape[:-1]
        h = jax.nn.relu(self.fc1(self.norm_in(x.reshape(-1, x.shape[-1]))))
        for norm, fc in zip(self.block_norms, self.block_fcs, strict=True):
            h = h + jax.nn.relu(fc(norm(h)))
        return self.fc2(self.norm_out(h)).reshape(*lead, -1)


def slot_attention(prompt_len: int, num_slots: int) -> jax.Array:
    """``[L, L]`` query-may-see-key booleans: causal over the prompt (which cannot see the
    slots), and every slot sees every position (key validity is applied separately)."""
    L = prompt_len + num_slots
    q = jnp.arange(L)[:, None]
    k = jnp.arange(L)[None, :]
    return (k <= q) | (q >= prompt_len)


class SlotOutput(NamedTuple):
    slots: jax.Array  # [B, num_slots, d] final hidden states of the action slots
    value_hidden: jax.Array  # [B, d] last prompt token


class OFTPolicy(nnx.Module):
    """An ``OpenVLA`` backbone with OFT action slots and head."""

    def __init__(self, vla: OpenVLA, config: OFTConfig, *, rngs: nnx.Rngs):
        self.vla = vla
        self.config = config
        d = vla.config.text.hidden_size
        kw = {"dtype": vla.dtype, "param_dtype": vla.param_dtype, "rngs": rngs}
        self.slot_embed = param(rngs, nnx.initializers.zeros, (config.num_slots, d), vla.param_dtype, (None, "embed"))
        if config.head == "continuous":
            self.action_head = L1RegressionHead(d, config.action_dim, config.resnet_blocks, **kw)
            self.log_std = param(
                rngs, nnx.initializers.constant(config.init_log_std), (config.action_dim,), jnp.float32, (None,)
            )
        else:
            self.action_head = None
            self.log_std = None

    def slot_states(self, input_ids, attention_mask, pixels, extra_embeds=None) -> SlotOutput:
        """``extra_embeds [B, E, d]`` (e.g. projected proprioception, as OFT feeds it) join
        the end of the prompt: causal like it, seen by every slot."""
        embeds, mask = self.vla.multimodal_inputs(input_ids, attention_mask, pixels)
        if extra_embeds is not None:
            B, E = extra_embeds.shape[:2]
            embeds = jnp.concatenate([embeds, extra_embeds.astype(embeds.dtype)], axis=1)
            mask = jnp.concatenate([mask, jnp.ones((B, E), bool)], axis=1)
        B, P, d = embeds.shape
        S = self.config.num_slots
        slots = jnp.broadcast_to(self.slot_embed[...].astype(embeds.dtype), (B, S, d))
        x = jnp.concatenate([embeds, slots], axis=1)
        full = jnp.concatenate([mask, jnp.ones((B, S), bool)], axis=1)
        h = self.vla.llm.hidden_states(attention_mask=full, inputs_embeds=x, mask=slot_attention(P, S)[None])
        return SlotOutput(h[:, P:], h[:, P - 1])

    # Discrete head -------------------------------------------------------------------
    def slot_logits(self, slots: jax.Array) -> jax.Array:
        """Full-vocabulary float32 logits of each slot ``[B, num_slots, V]``."""
        return self.vla.llm.logits(slots)

    # Continuous head -----------------------------------------------------------------
    def regress(self, slots: jax.Array) -> jax.Array:
        """Normalised actions ``[B, chunk, action_dim]`` from the L1 regression head."""
        c = self.config
        B = slots.shape[0]
        return self.action_head(slots.reshape(B, c.chunk, c.action_dim * slots.shape[-1])).astype(jnp.float32)


class ChunkForward(NamedTuple):
    logprobs: jax.Array  # [B, num_slots] per scalar (discrete: restricted token log-probs)
    chunk_logprob: jax.Array  # [B]
    entropy: jax.Array  # [B, num_slots]
    value_hidden: jax.Array  # [B, d]
    prediction: jax.Array  # discrete: restricted logits [B, num_slots, bins]; continuous: means [B, chunk, dim]


def _gaussian(mean, log_std, actions):
    z = (actions - mean) * jnp.exp(-log_std)
    lp = -0.5 * z * z - log_std - 0.5 * jnp.log(2 * jnp.pi)
    ent = jnp.broadcast_to(0.5 + 0.5 * jnp.log(2 * jnp.pi) + log_std, mean.shape)
    return lp, ent


def forward_chunk(policy: OFTPolicy, input_ids, attention_mask, pixels, actions, temperature=1.0) -> ChunkForward:
    """Log-probs of a chunk under the policy: discrete ``actions`` are action ids ``[B,
    num_slots]`` (step-major), continuous ones normalised actions ``[B, chunk, action_dim]``."""
    out = policy.slot_states(input_ids, attention_mask, pixels)
    B = out.slots.shape[0]
    if policy.action_head is None:
        tok = policy.vla.config.tokenizer
        logits = policy.slot_logits(out.slots)
        lp = at.token_logprobs(tok, logits, actions, temperature)
        ent = at.token_entropy(tok, logits, temperature)
        prediction = tok.restrict(logits)
    else:
        mean = policy.regress(out.slots)
        lp, ent = _gaussian(mean, policy.log_std[...], actions.astype(jnp.float32))
        lp, ent, prediction = lp.reshape(B, -1), ent.reshape(B, -1), mean
    return ChunkForward(lp, jnp.sum(lp, axis=-1), ent, out.value_hidden, prediction)


class Chunk(NamedTuple):
    actions: jax.Array  # normalised actions [B, chunk, action_dim]
    tokens: jax.Array  # discrete: action ids [B, num_slots]; continuous: the sampled actions again
    logprobs: jax.Array  # [B, num_slots]
    value_hidden: jax.Array  # [B, d]


def sample_chunk(policy: OFTPolicy, input_ids, attention_mask, pixels, key, temperature=0.0) -> Chunk:
    """One forward pass: the whole chunk at once (greedy when ``temperature <= 0``)."""
    c = policy.config
    out = policy.slot_states(input_ids, attention_mask, pixels)
    B, S, _ = out.slots.shape
    if policy.action_head is None:
        tok = policy.vla.config.tokenizer
        logits = policy.slot_logits(out.slots).reshape(B * S, -1)
        ids, lp = at.choose(tok, logits, key, temperature)
        ids, lp = ids.reshape(B, S), lp.reshape(B, S)
        actions = tok.decode(ids).reshape(B, c.chunk, c.action_dim)
        return Chunk(actions, ids, lp, out.value_hidden)
    mean = policy.regress(out.slots)
    log_std = policy.log_std[...]
    noise = jax.random.normal(key, mean.shape)
    actions = jnp.where(temperature > 0, mean + temperature * jnp.exp(log_std) * noise, mean)
    lp, _ = _gaussian(mean, log_std, actions)
    return Chunk(actions, actions, lp.reshape(B, -1), out.value_hidden)


def l1_loss(policy: OFTPolicy, input_ids, attention_mask, pixels, target) -> jax.Array:
    """OFT's training loss for the continuous head: mean |prediction - target|."""
    out = policy.slot_states(input_ids, attention_mask, pixels)
    return jnp.mean(jnp.abs(policy.regress(out.slots) - target))
