"""A VLA policy for the embodied PPO / GRPO trainer: OpenVLA's backbone decoding a whole
action chunk in parallel through bidirectional action slots (the OFT way), with discrete
action bins.

One forward pass per env step (`oft.OFTPolicy`): ``[BOS, image patches, instruction,
proprioception, action slots]`` runs through the Llama backbone; each of the
``chunk_length x 7`` slots reads every prompt token and every other slot, and its logits
over the action bins give one action dimension.
Autoregressive decoding would cost ``chunk_length x 7`` cached passes per step, which is
what makes OpenVLA slow to fine-tune with RL; the parallel form keeps the same discrete
action space and log-probs at one pass: summed over the chunk (RLinf's chunk level, the
default), per step of the chunk or per token (``actor.model.vla.logprob_level``).

The stored action is the chunk of bin indices ``[B, chunk x 7]`` (int32); the env gets bin
centres in [-1, 1] shaped ``[B, chunk, 7]``. Proprioception enters as one projected token
at the end of the prompt, so the gripper state the camera cannot see is known to the
policy. The value head reads that token's final hidden state.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm import LMConfig
from rlinf_jax.policies.lm.published import PUBLISHED_VLA
from rlinf_jax.policies.lm.config import RopeConfig
from rlinf_jax.policies.vla.action_tokens import reduce_logprobs
from rlinf_jax.policies.vla.heads import ValueHead
from rlinf_jax.policies.vla.oft import OFTConfig, OFTPolicy
from rlinf_jax.policies.vla.openvla import OpenVLA, OpenVLAConfig
from rlinf_jax.policies.vla.vit import ViTConfig


def tower_config(model_cfg, image_size: int, *, final_norm: bool) -> ViTConfig:
    """The SigLIP-style vision tower ``actor.model.vla.*`` describes, for ``image_size`` px."""
    m = model_cfg
    if image_size % m.vla.patch_size:
        raise BadInput(
            f"actor.model.vla.patch_size={m.vla.patch_size} does not divide the env's {image_size} px images"
        )
    return ViTConfig(
        model_type="siglip_vision_model",
        hidden_size=m.vla.vision_hidden_size,
        intermediate_size=4 * m.vla.vision_hidden_size,
        num_layers=m.vla.vision_layers,
        num_heads=m.vla.vision_heads,
        image_size=image_size,
        patch_size=m.vla.patch_size,
        gelu_approximate=True,
        final_norm=final_norm,
    )


def published_vla(model_cfg, kind: str) -> dict:
    """The published ``config.json`` fields ``actor.model.architecture`` names for a policy of
    ``kind`` (`policies.lm.published.PUBLISHED_VLA`)."""
    name = model_cfg.architecture
    family = {"vla": "openvla", "pi0": "pi0", "pi05": "pi05", "gr00t": "gr00t_n1_5"}[kind]
    known = [k for k, hf in PUBLISHED_VLA.items() if hf["model_type"] == family]
    if name not in known:
        raise BadInput(
            f"actor.model.architecture={name!r} is not a published {kind} architecture this project knows; "
            f"choose one of {', '.join(known)}, or leave it empty for the sizes actor.model.lm.* / vla.* give"
        )
    return PUBLISHED_VLA[name]


def check_image_size(model_cfg, wanted: int, image_size: int) -> None:
    if wanted != image_size:
        raise BadInput(
            f"actor.model.architecture={model_cfg.architecture} reads {wanted} px images; the env renders "
            f"{image_size} px: set env.image_size={wanted}"
        )


def openvla_config(model_cfg, image_size: int, text_vocab: int) -> OpenVLAConfig:
    """The policy's backbone: the published OpenVLA ``actor.model.architecture`` names, or an
    OpenVLA-shaped model of the sizes ``actor.model`` gives (`tiny_openvla_config`)."""
    if not model_cfg.architecture:
        return tiny_openvla_config(model_cfg, image_size, text_vocab)
    config = OpenVLAConfig.from_hf_config(published_vla(model_cfg, "vla"))
    check_image_size(model_cfg, config.image_size, image_size)
    first_action = config.action_vocab_end - config.n_action_bins
    if text_vocab > first_action:
        raise BadInput(
            f"the env's {text_vocab} instruction ids overlap {model_cfg.architecture}'s action ids "
            f"(from {first_action})"
        )
    return config


def tiny_openvla_config(model_cfg, image_size: int, text_vocab: int) -> OpenVLAConfig:
    """An OpenVLA-shaped model of the sizes ``actor.model`` names: one SigLIP-style tower,
    a Llama backbone whose vocabulary is the instruction words plus the action bins."""
    m = model_cfg
    vision = tower_config(m, image_size, final_norm=False)
    head_dim = m.lm.hidden_size // m.lm.num_heads
    text = LMConfig(
        model_type="llama",
        vocab_size=text_vocab + m.vla.n_bins,
        hidden_size=m.lm.hidden_size,
        intermediate_size=m.lm.intermediate_size,
        num_layers=m.lm.num_layers,
        num_heads=m.lm.num_heads,
        num_kv_heads=m.lm.num_kv_heads,
        head_dim=head_dim,
        rope=RopeConfig(),
        max_position_embeddings=m.lm.max_position_embeddings,
    )
    return OpenVLAConfig(
        vision=(vision,),
        vision_depths=(m.vla.vision_layers,),
        text=text,
        n_action_bins=m.vla.n_bins,
        action_vocab_end=text_vocab + m.vla.n_bins,
    )


IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class ChunkActorCritic(nnx.Module):
    """An OFT policy (OpenVLA backbone + parallel action slots, discrete head), a
    proprioception token and a value head on the last prompt state."""

    def __init__(
        self, config: OpenVLAConfig, chunk: int, action_dim: int, proprio_size: int, *, dtype=jnp.float32,
        rngs: nnx.Rngs, scan_layers: bool = False, remat: str = "none",
    ):
        d = config.text.hidden_size
        # ``dtype`` is the backbone's compute dtype; parameters stay float32 for the optimiser.
        vla = OpenVLA(config, dtype=dtype, param_dtype=jnp.float32, rngs=rngs, scan_layers=scan_layers, remat=remat)
        self.oft = OFTPolicy(vla, OFTConfig(chunk, action_dim, "discrete"), rngs=rngs)
        self.proprio = nnx.Linear(proprio_size, d, rngs=rngs)
        self.value = ValueHead(d, (d,), rngs=rngs)

    def __call__(self, obs) -> tuple[jax.Array, jax.Array]:
        """Restricted action logits ``[B, slots, n_bins]`` and values ``[B]``."""
        tokens = obs["tokens"].astype(jnp.int32)
        pixels = obs["image"].astype(jnp.float32)
        if obs["image"].dtype == jnp.uint8:
            pixels = pixels / 255.0
        if self.oft.vla.config.fused:
            # Prismatic's two towers each read their own copy: DINOv2's normalised with
            # ImageNet's statistics, then SigLIP's.
            dino = (pixels - jnp.asarray(IMAGENET_MEAN)) / jnp.asarray(IMAGENET_STD)
            pixels = jnp.concatenate([dino, pixels * 2.0 - 1.0], axis=-1)
        else:
            pixels = pixels * 2.0 - 1.0  # SigLIP's [-1, 1] input range
        valid = tokens != 0  # the instruction vocabulary pads with id 0, on the right
        proprio = self.proprio(obs["proprio"].astype(jnp.float32))[:, None]
        out = self.oft.slot_states(tokens, valid, pixels, extra_embeds=proprio)
        logits = self.oft.vla.config.tokenizer.restrict(self.oft.slot_logits(out.slots))
        return logits, self.value(out.value_hidden)


class ChunkVLAPolicy:
    """`EmbodiedPolicy` over `ChunkActorCritic` (see the module docstring)."""

    normalizable_observations = False

    def __init__(self, model_cfg, image_size: int, text_vocab: int, chunk_length: int, action_size: int, proprio_size: int):
        self.config = openvla_config(model_cfg, image_size, text_vocab)
        self.chunk_length, self.action_size, self.proprio_size = chunk_length, action_size, proprio_size
        self.num_slots = chunk_length * action_size
        self.temperature = float(model_cfg.vla.temperature)
        self.logprob_level = model_cfg.vla.logprob_level
        self.dtype = jnp.bfloat16 if model_cfg.dtype == "bfloat16" else jnp.float32
        self.scan_layers, self.remat = bool(model_cfg.scan_layers), str(model_cfg.remat)
        self.tokenizer = self.config.tokenizer

    def build(self, rngs: nnx.Rngs) -> ChunkActorCritic:
        return ChunkActorCritic(
            self.config, self.chunk_length, self.action_size, self.proprio_size, dtype=self.dtype, rngs=rngs,
            scan_layers=self.scan_layers, remat=self.remat,
        )

    def env_action(self, bins: jax.Array) -> jax.Array:
        """Bin indices ``[B, slots]`` -> bin centres ``[B, chunk, 7]`` in [-1, 1]."""
        return self.tokenizer.decode(self.tokenizer.first_id + bins).reshape(bins.shape[0], self.chunk_length, self.action_size)

    def _stored_logprob(self, logp, bins):
        """Log-probs of the chosen bins at ``vla.logprob_level``: ``[B]`` (chunk), ``[B,
        chunk]`` (action) or ``[B, chunk x 7]`` (token)."""
        token_lp = jnp.take_along_axis(logp, bins[..., None].astype(jnp.int32), axis=-1)[..., 0]
        return reduce_logprobs(token_lp, self.action_size, self.logprob_level)

    def _logp(self, logits):
        return jax.nn.log_softmax(logits.astype(jnp.float32) / self.temperature, axis=-1)

    def act(self, model, obs, keys):
        return self.act_with_value(model, obs, keys)[:3]

    def act_with_value(self, model, obs, keys):
        """`act` plus the value the same forward pass computes (RLinf's rollout values): the
        learner then needs no critic pass over the trajectory."""
        logits, value = model(obs)
        logp = self._logp(logits)
        bins = jax.vmap(lambda k, lp: jax.random.categorical(k, lp, axis=-1))(keys, logp).astype(jnp.int32)
        return self.env_action(bins), bins, self._stored_logprob(logp, bins), value

    def act_deterministic(self, model, obs):
        logits, _ = model(obs)
        return self.env_action(jnp.argmax(logits, axis=-1).astype(jnp.int32))

    def evaluate_actions(self, model, obs, stored_action, key):
        del key  # the entropy of a categorical is exact
        logits, value = model(obs)
        logp = self._logp(logits)
        entropy = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
        return self._stored_logprob(logp, stored_action), jnp.sum(entropy, axis=-1), value

    def critic(self, model, obs):
        return model(obs)[1]


def tabletop_spec(env, kind: str, suite: str) -> tuple[int, int, int, int]:
    """``(image size, instruction vocabulary, chunk length, proprio size)`` of an env with
    image, tokens and proprio observations: what a VLA policy is sized from."""
    base = env.unwrapped
    shapes = getattr(env, "observation_shapes", None) or getattr(base, "observation_shapes", None)
    if not isinstance(shapes, dict) or not {"image", "tokens", "proprio"} <= set(shapes):
        raise BadInput(
            f"actor.model.kind={kind} needs an env with image, tokens and proprio observations; "
            f"env.suite={suite} has none (use env.suite=tabletop, or a robosuite env with env.camera=agentview)"
        )
    return shapes["image"][0], int(base.vocab_size), int(getattr(base, "chunk_length", 1)), shapes["proprio"][0]


def vla_policy(cfg, env) -> ChunkVLAPolicy:
    image_size, vocab, chunk, proprio = tabletop_spec(env, "vla", cfg.env.suite)
    return ChunkVLAPolicy(cfg.actor.model, image_size, vocab, chunk, env.action_size, proprio)
