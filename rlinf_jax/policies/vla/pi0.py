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

Flow convention (openpi / transformers): ``x_t = t * noise + (1 - t) * actions``, the
expert's output projected to ``action_dim`` is the velocity ``noise - actions``, and
sampling takes Euler steps ``x += -1/N * v`` from ``t = 1`` to ``0``.

For RL (piRL, RLinf) ``sample_with_logprob`` makes the chain stochastic, by the flow-SDE
(one random step) or by a learned noise head (flow-noise; ``flow_steps`` has the maths), and
``chain_logprob`` re-evaluates a stored chain under new parameters. The value head reads the
expert's output at the state token: that token attends only to the prefix and itself, so its
value is a function of the observation alone, the same at every denoising step.

Shapes: ``B`` batch, ``P`` prefix tokens, ``H`` = ``chunk_size``, ``A`` = ``max_action_dim``,
``E`` expert width. Images are ``[B, cameras, H_img, W_img, C]``, channels last.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm.attention import KVCache
from rlinf_jax.policies.lm.config import LMConfig
from rlinf_jax.policies.lm.layers import Dense
from rlinf_jax.policies.lm.model import CausalLM
from rlinf_jax.policies.vla import flow_steps
from rlinf_jax.policies.vla.paligemma import PaliGemma, PaliGemmaConfig

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
        text, expert = self.paligemma.text, self.expert
        for name in ("num_layers", "num_kv_heads", "head_dim"):
            if getattr(text, name) != getattr(expert, name):
                raise BadInput(
                    f"the action expert's {name}={getattr(expert, name)} differs from PaliGemma's "
                    f"{getattr(text, name)}; shared attention needs them equal"
                )
        if expert.hidden_size % 2:
            raise BadInput(f"the action expert's hidden_size={expert.hidden_size} must be even (sin/cos halves)")
        lo, hi = self.noise_std_range
        if not 0 < lo <= hi:
            raise BadInput(f"noise_std_range={self.noise_std_range} must satisfy 0 < min <= max")

    @classmethod
    def from_hf_config(cls, hf: dict, **rl) -> Pi0Config:
        """Read a ``PI0ForConditionalGeneration`` config.json dict; ``rl`` sets the RL-head
        fields (``value_hidden``, ``noise_hidden``, ``noise_std_range``)."""
        if hf.get("model_type") != "pi0":
            raise BadInput(f"config.json model_type={hf.get('model_type')!r} is not 'pi0'")
        paligemma = PaliGemmaConfig.from_hf_config({"model_type": "paligemma", **hf.get("vlm_config", {})})
        expert = {**_EXPERT_DEFAULTS, "vocab_size": paligemma.text.vocab_size, **hf.get("dit_config", {})}
        fields = {
            "chunk_size": int(hf.get("chunk_size", 50)),
            "max_state_dim": int(hf.get("max_state_dim", 32)),
            "max_action_dim": int(hf.get("max_action_dim", 32)),
            "num_steps": int(hf.get("num_inference_steps", 10)),
            "min_period": float(hf.get("min_period", 4e-3)),
            "max_period": float(hf.get("max_period", 4.0)),
        }
        return cls(paligemma, LMConfig.from_hf_config(expert), **fields, **rl)


class Prefix(NamedTuple):
    """The prefix, encoded once per observation."""

    cache: KVCache  # P + 1 + H slots per row; slots 0..P-1 filled
    mask: jax.Array  # [B, P] bool: real prefix tokens


class FlowSample(NamedTuple):
    actions: jax.Array  # [B, H, A] the chain's end, x at t = 0
    chain: jax.Array  # [B, N + 1, H, A] x_0 = noise, ..., x_N = actions
    stochastic_step: jax.Array  # [B] int32: flow-SDE's random step; -1 for flow-noise (all steps)
    logprob: jax.Array  # [B, H, A] float32 per-element log-density of the stochastic steps
    value: jax.Array  # [B] float32 (zeros without a value head)


class MLPHead(nnx.Module):
    """``Dense -> act -> ... -> Dense`` on ``[tokens, in]`` activations."""

    def __init__(self, sizes: tuple[int, ...], activation, *, dtype, param_dtype, rngs):
        kw = {"use_bias": True, "dtype": dtype, "param_dtype": param_dtype, "rngs": rngs}
        self.sizes = tuple(sizes)
        self.activation = activation
        self.layers = nnx.List([Dense(i, o, (None, None), **kw) for i, o in itertools.pairwise(sizes)])

    def __call__(self, x):
        for layer in self.layers[:-1]:
            x = self.activation(layer(x))
        return self.layers[-1](x)


def time_embedding(t: jax.Array, width: int, min_period: float, max_period: float) -> jax.Array:
    """``[sin(2 pi t / period), cos(2 pi t / period)]`` over ``width // 2`` periods spaced
    geometrically in ``[min_period, max_period]``; ``t [B]`` -> ``[B, width]`` float32.

    The frequencies are computed in float32 as openpi computes them (the weights were trained
    with these roundings); the highest is ~1571, where one float32 step is 1.2e-4.
    """
    fraction = jnp.linspace(0.0, 1.0, width // 2, dtype=jnp.float32)
    period = min_period * (max_period / min_period) ** fraction
    freq = 1.0 / period * 2 * jnp.pi
    angle = freq[None, :] * t.astype(jnp.float32)[:, None]
    return jnp.concatenate([jnp.sin(angle), jnp.cos(angle)], axis=-1)


class Pi0(nnx.Module):
    """pi0 (``PI0ForConditionalGeneration``) plus optional RL heads; see the module docstring."""

    def __init__(self, config: Pi0Config, *, dtype=jnp.float32, param_dtype=None, rngs: nnx.Rngs,
                 scan_layers: bool = False, remat: str = "none"):
        param_dtype = param_dtype or dtype
        kw = {"dtype": dtype, "param_dtype": param_dtype, "rngs": rngs}
        self.config = config
        self.dtype = dtype
        c, E = config, config.expert.hidden_size
        # ``scan_layers`` / ``remat``: every tower's and LM's blocks under lax.scan and a
        # rematerialisation policy (see `CausalLM`); a scanned prefix's KV cache is stacked,
        # as the expert's scanned layers read it.
        layout = {"scan_layers": scan_layers, "remat": remat}
        self.paligemma = PaliGemma(c.paligemma, **layout, **kw)
        self.expert = CausalLM(c.expert, token_embeddings=False, **layout, **kw)
        dense = {"use_bias": True, **kw}
        self.state_proj = Dense(c.max_state_dim, E, (None, "embed"), **dense)
        self.action_in_proj = Dense(c.max_action_dim, E, (None, "embed"), **dense)
        self.action_time_mlp_in = Dense(2 * E, E, (None, "embed"), **dense)
        self.action_time_mlp_out = Dense(E, E, ("embed", None), **dense)
        self.action_out_proj = Dense(E, c.max_action_dim, ("embed", None), **dense)
        self.value_head = (
            MLPHead((E, *c.value_hidden, 1), jax.nn.gelu, **kw) if c.value_hidden else None
        )
        self.noise_head = (
            MLPHead((E, *c.noise_hidden, c.max_action_dim), jnp.tanh, **kw) if c.noise_hidden else None
        )

    # -- prefix ------------------------------------------------------------------------

    def encode_prefix(self, input_ids, pixels, attention_mask, camera_mask=None) -> Prefix:
        """Run the prefix once: ``input_ids / attention_mask [B, P]``, ``pixels [B, cameras, ...]``."""
        B, P = input_ids.shape
        S = P + 1 + self.config.chunk_size
        valid = attention_mask.astype(bool)
        embeds = self.paligemma.embed_prefix(input_ids, pixels, camera_mask)
        key_valid = jnp.concatenate([valid, jnp.zeros((B, S - P), bool)], axis=1)
        # Bidirectional over the prefix; positions 0-based counts of real tokens.
        mask = jnp.broadcast_to((jnp.arange(S) < P)[None, None, :], (B, P, S))
        positions = jnp.cumsum(valid, axis=1, dtype=jnp.int32) - 1
        lm = self.paligemma.language_model
        _, cache = lm.hidden_states(
            attention_mask=key_valid,
            positions=positions,
            cache=lm.init_cache(B, S),
            cache_index=0,
            inputs_embeds=embeds,
            mask=mask,
        )
        return Prefix(cache, valid)

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
        suffix = self.embed_suffix(state, x_t, t)
        B, P = prefix.mask.shape
        L = suffix.shape[1]
        key_valid = jnp.concatenate([prefix.mask, jnp.ones((B, L), bool)], axis=1)
        # The state token (row 0) sees the prefix and itself; action tokens see everything.
        rows, cols = jnp.arange(L)[:, None], jnp.arange(L)[None, :]
        suffix_mask = (rows >= 1) | (cols == 0)
        mask = jnp.concatenate([jnp.ones((L, P), bool), suffix_mask], axis=1)
        positions = jnp.sum(prefix.mask, axis=1, dtype=jnp.int32)[:, None] + jnp.arange(L, dtype=jnp.int32)
        hidden, _ = self.expert.hidden_states(
            attention_mask=key_valid,
            positions=positions,
            cache=prefix.cache,
            cache_index=P,
            inputs_embeds=suffix,
            mask=jnp.broadcast_to(mask[None], (B, L, P + L)),
        )
        return hidden

    def _heads(self, hidden: jax.Array):
        """(velocity [B, H, A], noise std [B, H, A] or None, value [B]) from expert outputs."""
        B, L, E = hidden.shape
        actions = hidden[:, 1:].reshape(B * (L - 1), E)
        v = self.action_out_proj(actions).reshape(B, L - 1, -1).astype(jnp.float32)
        std = None
        if self.noise_head is not None:
            lo, hi = (2 * np.log(s) for s in self.config.noise_std_range)  # log-variance bounds
            squashed = jnp.tanh(self.noise_head(actions).astype(jnp.float32)).reshape(v.shape)
            std = jnp.exp(0.5 * (lo + (hi - lo) * (squashed + 1) / 2))
        value = jnp.zeros((B,), jnp.float32)
        if self.value_head is not None:
            value = self.value_head(hidden[:, 0]).astype(jnp.float32)[:, 0]
        return v, std, value

    def velocity(self, prefix: Prefix, state, x_t, t) -> jax.Array:
        """The velocity field ``v(x_t, t) [B, H, A]`` (float32)."""
        return self._heads(self.expert_hidden(prefix, state, x_t, t))[0]

    def value(self, prefix: Prefix, state) -> jax.Array:
        """``[B]`` value of the observation (the state token does not see the actions)."""
        B = state.shape[0]
        x = jnp.zeros((B, self.config.chunk_size, self.config.max_action_dim), jnp.float32)
        return self._heads(self.expert_hidden(prefix, state, x, jnp.ones((B,), jnp.float32)))[2]

    # -- sampling ----------------------------------------------------------------------

    def sample_actions(self, prefix: Prefix, state, noise, num_steps: int | None = None) -> jax.Array:
        """Deterministic Euler integration from ``noise [B, H, A]`` at t = 1 to t = 0."""
        N = num_steps or self.config.num_steps
        B = noise.shape[0]
        dt = np.float32(-1.0 / N)

        def step(x, t):
            return x + dt * self.velocity(prefix, state, x, jnp.full((B,), t)), None

        x, _ = jax.lax.scan(step, noise.astype(jnp.float32), flow_steps.step_times(N))
        return x

    def sample_with_logprob(
        self,
        prefix: Prefix,
        state,
        key,
        *,
        method: str = flow_steps.FLOW_SDE,
        num_steps: int | None = None,
        noise_level: float = 0.5,
        noise=None,
        stochastic_step=None,
    ) -> FlowSample:
        """A stochastic denoising chain with the log-density of its stochastic steps.

        flow-SDE: step ``stochastic_step [B]`` (uniform in ``0..N-1`` when not given) follows
        the SDE with ``noise_level``; the other steps are Euler steps. flow-noise: every step
        adds the noise head's std. ``noise`` is the chain's start (drawn when not given).
        """
        c = self.config
        N = num_steps or c.num_steps
        B = state.shape[0]
        shape = (B, c.chunk_size, c.max_action_dim)
        k_noise, k_step, k_eps = jax.random.split(key, 3)
        x0 = jax.random.normal(k_noise, shape, jnp.float32) if noise is None else noise.astype(jnp.float32)
        if method == flow_steps.FLOW_SDE:
            if stochastic_step is None:
                stochastic_step = jax.random.randint(k_step, (B,), 0, N)
            stochastic_step = jnp.asarray(stochastic_step, jnp.int32)
        elif method == flow_steps.FLOW_NOISE:
            self._require_noise_head()
            stochastic_step = jnp.full((B,), -1, jnp.int32)
        else:
            raise BadInput(f"method={method!r} is not one of {', '.join(flow_steps.METHODS)}")
        times, sigmas = flow_steps.step_times(N), flow_steps.sde_sigmas(N, noise_level)
        eps = jax.random.normal(k_eps, (N, *shape), jnp.float32)

        def step(x, inputs):
            k, t, sigma, e = inputs
            mean, std, value = self._step_moments(prefix, state, x, k, t, sigma, stochastic_step, N, method)
            x_next = mean + std * e
            return x_next, (x_next, flow_steps.gaussian_logprob(x_next, mean, std), value)

        xs = (jnp.arange(N), times, sigmas, eps)
        x, (chain, logps, values) = jax.lax.scan(step, x0, xs)
        chain = jnp.concatenate([x0[:, None], jnp.moveaxis(chain, 0, 1)], axis=1)
        return FlowSample(x, chain, stochastic_step, logps.sum(0), values[0])

    def chain_logprob(
        self, prefix: Prefix, state, chain, stochastic_step, *, method: str = flow_steps.FLOW_SDE, noise_level=0.5
    ) -> tuple[jax.Array, jax.Array]:
        """(log-prob ``[B, H, A]``, value ``[B]``) of a stored ``chain [B, N + 1, H, A]`` under
        the current parameters: one expert pass for flow-SDE (its stochastic step), N for
        flow-noise. Same numbers as ``sample_with_logprob`` gave for the same parameters."""
        N = chain.shape[1] - 1
        times, sigmas = flow_steps.step_times(N), flow_steps.sde_sigmas(N, noise_level)
        if method == flow_steps.FLOW_SDE:
            k = jnp.asarray(stochastic_step, jnp.int32)
            x = jnp.take_along_axis(chain, k[:, None, None, None], axis=1)[:, 0]
            x_next = jnp.take_along_axis(chain, k[:, None, None, None] + 1, axis=1)[:, 0]
            t, sigma = jnp.asarray(times)[k], jnp.asarray(sigmas)[k]
            mean, std, value = self._step_moments(prefix, state, x, k, t, sigma, k, N, method)
            return flow_steps.gaussian_logprob(x_next, mean, std), value
        if method != flow_steps.FLOW_NOISE:
            raise BadInput(f"method={method!r} is not one of {', '.join(flow_steps.METHODS)}")
        self._require_noise_head()

        def step(total, inputs):
            k, t, x, x_next = inputs
            mean, std, value = self._step_moments(prefix, state, x, k, t, 0.0, None, N, method)
            return total + flow_steps.gaussian_logprob(x_next, mean, std), value

        steps = jnp.moveaxis(chain, 1, 0)
        total, values = jax.lax.scan(
            step, jnp.zeros(chain[:, 0].shape, jnp.float32), (jnp.arange(N), times, steps[:-1], steps[1:])
        )
        return total, values[0]

    def _step_moments(self, prefix, state, x, k, t, sigma, stochastic_step, N, method):
        """(mean, std, value) of denoising step ``k`` at time ``t`` from ``x [B, H, A]``;
        ``t``, ``sigma`` scalars or ``[B]``."""
        B = x.shape[0]
        t = jnp.broadcast_to(jnp.asarray(t, jnp.float32), (B,))
        v, noise_std, value = self._heads(self.expert_hidden(prefix, state, x, t))
        delta = np.float32(1.0 / N)
        if method == flow_steps.FLOW_SDE:
            chosen = stochastic_step == k
            sigma = jnp.where(chosen, jnp.broadcast_to(jnp.asarray(sigma, jnp.float32), (B,)), 0.0)
            return (*flow_steps.sde_step(x, v, t[:, None, None], delta, sigma[:, None, None]), value)
        return x.astype(jnp.float32) - delta * v, noise_std, value

    def _require_noise_head(self):
        if self.noise_head is None:
            raise BadInput("flow-noise needs a noise head: build the model with noise_hidden=(...) in Pi0Config")

    # -- training ----------------------------------------------------------------------

    def flow_matching_loss(self, prefix: Prefix, state, actions, noise, t) -> jax.Array:
        """Per-element squared error ``[B, H, A]`` of the velocity at
        ``x_t = t * noise + (1 - t) * actions`` against ``noise - actions`` (``t [B]``)."""
        t3 = t.astype(jnp.float32)[:, None, None]
        x_t = t3 * noise + (1 - t3) * actions
        return jnp.square(self.velocity(prefix, state, x_t, t) - (noise - actions))
