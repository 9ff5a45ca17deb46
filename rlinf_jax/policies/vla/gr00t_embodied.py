"""GR00T-N1.5 as an embodied policy for the PPO / GRPO trainer (``actor.model.kind=gr00t``).

`Pi0Policy`'s chains, stored actions, losses and evaluation over `gr00t.Gr00t`: the camera
image and the instruction go through the Eagle backbone once per observation (the prompt is
pi0's: the image tokens, then the instruction ids; the image token is the id just past the
env's vocabulary), the proprioception through GR00T's state encoder, and the DiT denoises
one action chunk in ``pi0.num_steps`` steps. All envs are one embodiment (id 0 of the tiny
model; at the published size GR00T's ``new_embodiment`` slot, 31, which fine-tuning on a new
robot uses).

A tiny GR00T is sized by the same sections as pi0: the ``vla.*`` tower (SigLIP), the
``lm.*`` sizes as the Qwen3 language model (all its layers kept), and the DiT
``pi0.expert_hidden_size`` wide with ``lm.num_heads`` heads and twice the LM's layers
(cross-attention and self-attention interleaved), whose output and the per-embodiment MLPs
are ``pi0.expert_intermediate_size`` wide; one self-attention layer over the features. The
published options otherwise: no pixel shuffle, a one-layer connector, no projection.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm.config import LMConfig, RopeConfig
from rlinf_jax.policies.vla import flow_steps
from rlinf_jax.policies.vla.dit import DiTConfig
from rlinf_jax.policies.vla.embodied import check_image_size, published_vla, tabletop_spec, tower_config
from rlinf_jax.policies.vla.gr00t import EagleConfig, Gr00t, Gr00tConfig, Observation
from rlinf_jax.policies.vla.pi0_embodied import Pi0Policy

NEW_EMBODIMENT = 31  # GR00T-N1.5's slot for a robot it was not pre-trained on
TINY_FUTURE_TOKENS = 4


def gr00t_config(model_cfg, image_size: int, text_vocab: int, chunk: int, action_dim: int,
                 state_dim: int) -> Gr00tConfig:
    """The policy's model: GR00T-N1.5 at its published size (``actor.model.architecture``),
    its chunk and action sizes the env's, or a tiny GR00T of ``actor.model``'s sizes."""
    m = model_cfg
    value = (1024,) if m.architecture else (m.pi0.expert_hidden_size,)
    rl = {"value_hidden": value, "noise_hidden": value if m.pi0.method == flow_steps.FLOW_NOISE else ()}
    if m.architecture:
        hf = published_vla(m, "gr00t")
        head = {**hf["action_head_cfg"], "action_horizon": chunk, "action_dim": action_dim,
                "num_inference_timesteps": m.pi0.num_steps}
        config = Gr00tConfig.from_config({**hf, "action_head_cfg": head}, hf["backbone_cfg"]["eagle_config"], **rl)
        check_image_size(m, config.eagle.vision.image_size, image_size)
        if state_dim > config.max_state_dim:
            raise BadInput(f"the env's {state_dim} proprio dimensions exceed GR00T's max_state_dim="
                           f"{config.max_state_dim}")
        return config
    heads, E = m.lm.num_heads, m.pi0.expert_hidden_size
    for what, width in (("actor.model.lm.hidden_size", m.lm.hidden_size), ("actor.model.pi0.expert_hidden_size", E)):
        if width % heads:
            raise BadInput(f"{what}={width} is not a multiple of actor.model.lm.num_heads={heads}")
    lm = LMConfig(
        model_type="qwen3",
        vocab_size=text_vocab + 1,  # the instruction words and the image token
        hidden_size=m.lm.hidden_size,
        intermediate_size=m.lm.intermediate_size,
        num_layers=m.lm.num_layers,
        num_heads=heads,
        num_kv_heads=m.lm.num_kv_heads,
        head_dim=m.lm.hidden_size // heads,
        rope=RopeConfig(),
        tie_word_embeddings=True,
        qk_norm=True,
        max_position_embeddings=m.lm.max_position_embeddings,
    )
    eagle = EagleConfig(tower_config(m, image_size, final_norm=True), lm, image_token_id=text_vocab,
                        use_pixel_shuffle=False, mlp_connector_layers=1)
    W = m.pi0.expert_intermediate_size
    dit = DiTConfig(num_layers=2 * m.lm.num_layers, num_attention_heads=heads, attention_head_dim=E // heads,
                    output_dim=W, cross_attention_dim=m.lm.hidden_size, interleave_self_attention=True,
                    positional_embeddings=None)
    features = DiTConfig(num_layers=1, num_attention_heads=heads, attention_head_dim=m.lm.hidden_size // heads,
                         positional_embeddings=None, norm_elementwise_affine=True)
    return Gr00tConfig(eagle, dit, features, chunk_size=chunk, max_action_dim=action_dim, max_state_dim=state_dim,
                       hidden_size=W, input_embedding_dim=E, max_num_embodiments=1,
                       num_target_vision_tokens=TINY_FUTURE_TOKENS, max_seq_len=chunk, num_steps=m.pi0.num_steps,
                       **rl)


class Gr00tPolicy(Pi0Policy):
    """`Pi0Policy` over `gr00t.Gr00t` (see the module docstring)."""

    make_config = staticmethod(gr00t_config)
    model_class = Gr00t

    def __init__(self, model_cfg, image_size: int, text_vocab: int, chunk_length: int, action_size: int,
                 proprio_size: int):
        super().__init__(model_cfg, image_size, text_vocab, chunk_length, action_size, proprio_size)
        self.embodiment = NEW_EMBODIMENT if self.config.max_num_embodiments > NEW_EMBODIMENT else 0

    @staticmethod
    def image_slots(config) -> tuple[int, int]:
        return config.eagle.image_token_id, config.eagle.tokens_per_image

    def encode(self, model: Gr00t, obs) -> tuple[Observation, None]:
        """The observation's backbone features and state token, run once per chunk (the state
        is inside it, so the shared code's state argument is None)."""
        ids, mask, pixels = self.prompt(obs)
        proprio = obs["proprio"].astype(jnp.float32)
        return model.encode_observation(ids, pixels, mask, proprio, self.embodiment), None

    def row_axes(self, prefix: Observation):
        return jax.tree.map(lambda _: 0, prefix)


def gr00t_policy(cfg, env) -> Gr00tPolicy:
    image_size, vocab, chunk, proprio = tabletop_spec(env, "gr00t", cfg.env.suite)
    return Gr00tPolicy(cfg.actor.model, image_size, vocab, chunk, env.action_size, proprio)
