"""pi0 as an embodied policy for the PPO / GRPO trainer (``actor.model.kind=pi0``).

A tiny `pi0.Pi0` sized by ``actor.model``: a SigLIP-style tower (the ``vla.*`` sizes) and a
Gemma prefix (the ``lm.*`` sizes) read the camera image and the instruction, and a Gemma
action expert (``pi0.expert_*``; same layers, KV heads and head_dim as the prefix, as shared
attention needs) denoises one action chunk ``[chunk_length, 7]`` conditioned on the
proprioception as pi0's state token.

- **Prompt**: ``num_patches`` image tokens then the instruction ids. The instruction
  vocabulary is the env's (`env.vocab_size`) and the image token is the id just past it
  (pi0's convention: an out-of-vocabulary id, looked up as 0 and replaced by the patch
  features). The env right-pads the instruction with id 0; the attention mask drops those
  slots and positions count real tokens only, so padding changes nothing.
- **Sampling** (`act`): one chunk per env from the stochastic chain of ``pi0.method``
  (flow-SDE: one random denoising step is an SDE step of ``pi0.noise_level``; flow-noise:
  a learned std at every step), ``pi0.num_steps`` steps. Each env's chain is drawn from its
  own key alone (the sampler is vmapped over rows), so splitting the batch into micro-batches
  changes no sample. The env gets the chain's end clipped to [-1, 1].
- **Stored action**: ``{"chain": [B, N + 1, H, 7], "step": [B] int32}``, the whole denoising
  chain and flow-SDE's stochastic step (-1 for flow-noise): what the log-prob is defined on.
  The chunk's log-prob is the sum over its ``H x 7`` elements (RLinf's chunk level).
- **Training** (`evaluate_actions`): the stored chain re-scored under the current
  parameters (`Pi0.chain_logprob`; one expert pass for flow-SDE, ``N`` for flow-noise), the
  entropy of the stochastic step(s)' Gaussians, and the value head on the state token.
- **Evaluation** (`act_deterministic`): the plain Euler ODE sample from zero noise, pi0's
  mode-like action.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm.config import LMConfig, RopeConfig
from rlinf_jax.policies.vla import flow_steps
from rlinf_jax.policies.vla.embodied import check_image_size, published_vla, tabletop_spec, tower_config
from rlinf_jax.policies.vla.paligemma import PaliGemmaConfig
from rlinf_jax.policies.vla.pi0 import Pi0, Pi0Config, Prefix
from rlinf_jax.policies.vla.pi05 import STATE_BINS, Pi05, Pi05Config, discretize_state


def pi0_config(model_cfg, image_size: int, text_vocab: int, chunk: int, action_dim: int, state_dim: int) -> Pi0Config:
    """The policy's model: the published pi0 ``actor.model.architecture`` names, its chunk,
    state and action sizes those of the env (they size only the action expert's input and
    output projections), or a pi0 of the sizes ``actor.model`` gives (`tiny_pi0_config`)."""
    m = model_cfg
    if not m.architecture:
        return tiny_pi0_config(m, image_size, text_vocab, chunk, action_dim, state_dim)
    hf = {**published_vla(m, "pi0"), "chunk_size": chunk, "max_state_dim": state_dim, "max_action_dim": action_dim,
          "num_inference_steps": m.pi0.num_steps}
    config = Pi0Config.from_hf_config(hf, value_hidden=(1024,),
                                      noise_hidden=(1024,) if m.pi0.method == flow_steps.FLOW_NOISE else ())
    check_image_size(m, config.paligemma.vision.image_size, image_size)
    return config


def tiny_pi0_config(model_cfg, image_size: int, text_vocab: int, chunk: int, action_dim: int, state_dim: int) -> Pi0Config:
    """A pi0 of the sizes ``actor.model`` names (``vla.*`` tower, ``lm.*`` Gemma prefix,
    ``pi0.expert_*`` action expert), for ``chunk x action_dim`` chunks and a ``state_dim`` state."""
    m = model_cfg
    vision = tower_config(m, image_size, final_norm=True)
    if m.lm.hidden_size % m.lm.num_heads:
        raise BadInput(
            f"actor.model.lm.hidden_size={m.lm.hidden_size} is not a multiple of lm.num_heads={m.lm.num_heads}"
        )
    head_dim = m.lm.hidden_size // m.lm.num_heads

    def gemma(hidden: int, intermediate: int) -> LMConfig:
        # Prefix and expert share layers, KV heads and head_dim (their attention is joint).
        return LMConfig(
            model_type="gemma",
            vocab_size=text_vocab,
            hidden_size=hidden,
            intermediate_size=intermediate,
            num_layers=m.lm.num_layers,
            num_heads=m.lm.num_heads,
            num_kv_heads=m.lm.num_kv_heads,
            head_dim=head_dim,
            rope=RopeConfig(),
            tie_word_embeddings=True,
            max_position_embeddings=m.lm.max_position_embeddings,
        )

    E = m.pi0.expert_hidden_size
    return Pi0Config(
        paligemma=PaliGemmaConfig(vision, gemma(m.lm.hidden_size, m.lm.intermediate_size), image_token_id=text_vocab),
        expert=gemma(E, m.pi0.expert_intermediate_size),
        chunk_size=chunk,
        max_state_dim=state_dim,
        max_action_dim=action_dim,
        num_steps=m.pi0.num_steps,
        value_hidden=(E,),
        noise_hidden=(E,) if m.pi0.method == flow_steps.FLOW_NOISE else (),
    )


class Pi0Policy:
    """`EmbodiedPolicy` over `pi0.Pi0` (see the module docstring)."""

    normalizable_observations = False
    # The model family: its config from the policy's sizes, and its class (pi0.5's subclass swaps both).
    make_config = staticmethod(pi0_config)
    model_class = Pi0

    def __init__(self, model_cfg, image_size: int, text_vocab: int, chunk_length: int, action_size: int, proprio_size: int):
        self.config = self.make_config(model_cfg, image_size, text_vocab, chunk_length, action_size, proprio_size)
        self.chunk_length, self.action_size = chunk_length, action_size
        self.num_steps = int(model_cfg.pi0.num_steps)
        self.method = str(model_cfg.pi0.method)
        self.noise_level = float(model_cfg.pi0.noise_level)
        self.temperature = float(model_cfg.pi0.temperature)
        self.image_token, self.num_patches = self.image_slots(self.config)
        # The products' dtype; parameters stay float32 for the optimiser.
        self.dtype = jnp.bfloat16 if model_cfg.dtype == "bfloat16" else jnp.float32
        self.scan_layers, self.remat = bool(model_cfg.scan_layers), str(model_cfg.remat)

    @staticmethod
    def image_slots(config) -> tuple[int, int]:
        """(the image token id, image tokens per camera) of the model's prompt."""
        return config.paligemma.image_token_id, config.paligemma.tokens_per_image

    def build(self, rngs: nnx.Rngs) -> Pi0:
        return self.model_class(self.config, dtype=self.dtype, param_dtype=jnp.float32, rngs=rngs,
                                scan_layers=self.scan_layers, remat=self.remat)

    # -- observations ------------------------------------------------------------------

    def prompt(self, obs) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(input_ids ``[B, patches + 16]``, attention_mask, pixels ``[B, 1, S, S, 3]`` in [-1, 1])."""
        tokens = obs["tokens"].astype(jnp.int32)
        B = tokens.shape[0]
        image = jnp.full((B, self.num_patches), self.image_token, jnp.int32)
        ids = jnp.concatenate([image, tokens], axis=1)
        mask = jnp.concatenate([jnp.ones((B, self.num_patches), bool), tokens != 0], axis=1)
        pixels = obs["image"].astype(jnp.float32)
        if obs["image"].dtype == jnp.uint8:
            pixels = pixels / 255.0
        pixels = pixels * 2.0 - 1.0  # SigLIP's [-1, 1] input range
        return ids, mask, pixels[:, None]

    def encode(self, model: Pi0, obs) -> tuple[Prefix, jax.Array]:
        """The prefix (run once per observation) and the state ``[B, 4]``."""
        ids, mask, pixels = self.prompt(obs)
        return model.encode_prefix(ids, pixels, mask), obs["proprio"].astype(jnp.float32)

    def env_action(self, actions: jax.Array) -> jax.Array:
        return jnp.clip(actions, -1.0, 1.0)

    # -- the EmbodiedPolicy protocol ---------------------------------------------------

    def sample(self, model: Pi0, obs, keys):
        """The `FlowSample` of each env from its own key (``keys [B]``): rows are sampled one
        by one under vmap, so no row's noise depends on the batch it is in."""
        prefix, state = self.encode(model, obs)
        axes = self.row_axes(prefix)

        def one(prefix_row, state_row, key):
            row = jax.tree.map(jnp.expand_dims, prefix_row, axes)
            out = model.sample_with_logprob(
                row, None if state_row is None else state_row[None], key, method=self.method,
                num_steps=self.num_steps, noise_level=self.noise_level, temperature=self.temperature
            )
            return jax.tree.map(lambda x: x[0], out)

        return jax.vmap(one, in_axes=(axes, 0, 0))(prefix, state, keys)

    def row_axes(self, prefix):
        """The batch axis of each array of the encoded observation: 0, except a scanned
        model's stacked ``[layers, B, ...]`` cache, whose rows are on axis 1."""
        b = 1 if self.scan_layers else 0
        return Prefix(jax.tree.map(lambda _: b, prefix.cache), 0, 0)

    def act(self, model: Pi0, obs, keys):
        out = self.sample(model, obs, keys)
        stored = {"chain": out.chain, "step": out.stochastic_step}
        return self.env_action(out.actions), stored, jnp.sum(out.logprob, axis=(1, 2))

    def act_deterministic(self, model: Pi0, obs):
        prefix, state = self.encode(model, obs)
        B = obs["proprio"].shape[0]
        zeros = jnp.zeros((B, self.chunk_length, self.action_size), jnp.float32)
        return self.env_action(model.sample_actions(prefix, state, zeros, self.num_steps))

    def evaluate_actions(self, model: Pi0, obs, stored_action, key):
        del key  # the step Gaussians' entropies are exact
        prefix, state = self.encode(model, obs)
        chain, step = stored_action["chain"], stored_action["step"]
        if self.method == flow_steps.FLOW_SDE:
            logprob, value = model.chain_logprob(
                prefix, state, chain, step, method=self.method, noise_level=self.noise_level
            )
            # The stochastic step's std is fixed by the schedule: sqrt(1/N) * sigma_k.
            N = chain.shape[1] - 1
            std = np.sqrt(1.0 / N) * jnp.asarray(flow_steps.sde_sigmas(N, self.noise_level))[step]
            entropy = flow_steps.gaussian_entropy(std) * (chain.shape[2] * chain.shape[3])
            return jnp.sum(logprob, axis=(1, 2)), entropy, value
        return self._noise_chain_terms(model, prefix, state, chain)

    def _noise_chain_terms(self, model: Pi0, prefix, state, chain):
        """flow-noise: (log-prob, entropy, value) of the whole chain, all ``N`` steps in one
        scan (the entropy needs each step's learned std, which `chain_logprob` does not return)."""
        N = chain.shape[1] - 1
        steps = jnp.moveaxis(chain, 1, 0)

        def step(totals, inputs):
            k, t, x, x_next = inputs
            mean, std, value = model._step_moments(prefix, state, x, k, t, 0.0, None, N, self.method)
            logp = jnp.sum(flow_steps.gaussian_logprob(x_next, mean, std), axis=(1, 2))
            ent = jnp.sum(flow_steps.gaussian_entropy(std), axis=(1, 2))
            return (totals[0] + logp, totals[1] + ent), value

        zeros = jnp.zeros(chain.shape[:1], jnp.float32)
        xs = (jnp.arange(N), jnp.asarray(flow_steps.step_times(N)), steps[:-1], steps[1:])
        (logprob, entropy), values = jax.lax.scan(step, (zeros, zeros), xs)
        return logprob, entropy, values[0]

    def critic(self, model: Pi0, obs):
        prefix, state = self.encode(model, obs)
        return model.value(prefix, state)


def pi0_policy(cfg, env) -> Pi0Policy:
    image_size, vocab, chunk, proprio = tabletop_spec(env, "pi0", cfg.env.suite)
    return Pi0Policy(cfg.actor.model, image_size, vocab, chunk, env.action_size, proprio)


# -- pi0.5 -------------------------------------------------------------------------------


def pi05_config(model_cfg, image_size: int, text_vocab: int, chunk: int, action_dim: int, state_dim: int) -> Pi05Config:
    """pi0.5's model: the published sizes ``actor.model.architecture`` names (``pi05``), or
    pi0's tiny sizes (`tiny_pi0_config`) with pi0.5's expert (adaptive norms) and a
    vocabulary that also holds the image token and the state's ``pi0.state_bins`` bins
    (published weights read openpi's 256, the end of PaliGemma's vocabulary)."""
    m = model_cfg
    value = (1024,)
    noise = (1024,) if m.pi0.method == flow_steps.FLOW_NOISE else ()
    if m.architecture:
        hf = {**published_vla(m, "pi05"), "chunk_size": chunk, "max_state_dim": state_dim,
              "max_action_dim": action_dim, "num_inference_steps": m.pi0.num_steps}
        config = Pi05Config.from_lerobot_config(hf, value_hidden=value, noise_hidden=noise)
        check_image_size(m, config.paligemma.vision.image_size, image_size)
        if m.pi0.state_bins != STATE_BINS:
            raise BadInput(f"actor.model.pi0.state_bins={m.pi0.state_bins}: the published pi0.5 reads its state in "
                           f"openpi's {STATE_BINS} bins; set it to {STATE_BINS} with actor.model.architecture")
        return config
    pi0 = tiny_pi0_config(m, image_size, text_vocab, chunk, action_dim, state_dim)
    vocab = text_vocab + 1 + m.pi0.state_bins
    text = dataclasses.replace(pi0.paligemma.text, vocab_size=vocab)
    expert = dataclasses.replace(pi0.expert, vocab_size=vocab, adarms_cond_dim=pi0.expert.hidden_size)
    return Pi05Config(
        paligemma=PaliGemmaConfig(pi0.paligemma.vision, text, image_token_id=text_vocab),
        expert=expert,
        chunk_size=chunk,
        max_state_dim=state_dim,
        max_action_dim=action_dim,
        num_steps=pi0.num_steps,
        value_hidden=(text.hidden_size,),
        noise_hidden=pi0.noise_hidden,
    )


class Pi05Policy(Pi0Policy):
    """`Pi0Policy` over `pi05.Pi05`: the same chains, stored actions and losses; the prompt
    ends with the proprioception as pi0.5 reads it, each dimension normalised to [-1, 1] by
    the env's ``proprio_range`` and cut into ``pi0.state_bins`` bins (openpi's 256), one
    token per dimension: the last ``state_bins`` ids of the vocabulary (the tiny model's
    vocabulary is the instruction words, the image token and these bins; at the published
    size they are the end of PaliGemma's). These are
    bin ids, not openpi's text (``State: 12 200 ...;`` through the PaliGemma tokenizer), so
    converted pi0.5 weights would need openpi's prompt. The model ignores the state argument
    the shared code passes."""

    make_config = staticmethod(pi05_config)
    model_class = Pi05

    def __init__(self, model_cfg, image_size: int, text_vocab: int, chunk_length: int, action_size: int,
                 proprio_size: int, proprio_range=None):
        super().__init__(model_cfg, image_size, text_vocab, chunk_length, action_size, proprio_size)
        self.state_bins = model_cfg.pi0.state_bins
        self.state_token_base = self.config.paligemma.text.vocab_size - self.state_bins
        if self.state_token_base <= text_vocab:
            raise BadInput(f"pi0.5's vocabulary ({self.config.paligemma.text.vocab_size}) has no room for the "
                           f"{text_vocab} instruction ids and {self.state_bins} state bins")
        if proprio_range is None:
            raise BadInput("actor.model.kind=pi05 writes the proprioception into its prompt in bins over the env's "
                           "proprio_range, which this env does not give (the tabletop does)")
        low, high = proprio_range
        self.proprio_low, self.proprio_high = np.asarray(low, np.float32), np.asarray(high, np.float32)

    def prompt(self, obs):
        ids, mask, pixels = super().prompt(obs)
        proprio = obs["proprio"].astype(jnp.float32)
        scaled = 2.0 * (proprio - self.proprio_low) / (self.proprio_high - self.proprio_low) - 1.0
        state = self.state_token_base + discretize_state(scaled, self.state_bins)
        ids = jnp.concatenate([ids, state], axis=1)
        return ids, jnp.concatenate([mask, jnp.ones(state.shape, bool)], axis=1), pixels


def pi05_policy(cfg, env) -> Pi05Policy:
    image_size, vocab, chunk, proprio = tabletop_spec(env, "pi05", cfg.env.suite)
    proprio_range = getattr(env.unwrapped, "proprio_range", None)
    return Pi05Policy(cfg.actor.model, image_size, vocab, chunk, env.action_size, proprio, proprio_range)
