"""What pi0, pi0.5 and GR00T share: an observation encoded once, an action model that
denoises a chunk over it, and the stochastic denoising chains RL needs.

A `FlowModel` subclass supplies ``outputs(prefix, state, x_t, t)``, the velocity field (and,
when it has them, the flow-noise std and the value) at one point of the flow, where
``prefix`` is whatever its observation encoding returns with the batch on the first axis of
its ``mask`` (pi0's `Prefix`; GR00T's ``Observation``); everything else here (deterministic Euler sampling, flow-SDE / flow-noise chains with their log-probs,
re-scoring a stored chain, the flow-matching loss) is written once on top of it.

Flow convention (openpi / transformers / lerobot): ``x_t = t * noise + (1 - t) * actions``,
the expert's output projected to ``action_dim`` is the velocity ``noise - actions``, and
sampling takes Euler steps ``x += -1/N * v`` from ``t = 1`` to ``0``. For RL (piRL, RLinf)
``sample_with_logprob`` makes the chain stochastic, by the flow-SDE (one random step) or by
a learned noise head (flow-noise; ``flow_steps`` has the maths), and ``chain_logprob``
re-evaluates a stored chain under new parameters.

Shapes: ``B`` batch, ``P`` prefix tokens, ``H`` = ``chunk_size``, ``A`` = ``max_action_dim``.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm.attention import KVCache
from rlinf_jax.policies.lm.layers import Dense
from rlinf_jax.policies.lm.model import CausalLM
from rlinf_jax.policies.vla import flow_steps
from rlinf_jax.policies.vla.paligemma import PaliGemma


class Prefix(NamedTuple):
    """The prefix, encoded once per observation."""

    cache: KVCache  # P + suffix slots per row; slots 0..P-1 filled
    mask: jax.Array  # [B, P] bool: real prefix tokens
    pooled: jax.Array | None = None  # [B, D] mean final hidden state over real tokens (read by pi0.5's value head)


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


def time_embedding(t: jax.Array, width: int, min_period: float, max_period: float, exact: bool = False) -> jax.Array:
    """``[sin(2 pi t / period), cos(2 pi t / period)]`` over ``width // 2`` periods spaced
    geometrically in ``[min_period, max_period]``; ``t [B]`` -> ``[B, width]`` float32.

    By default the frequencies and angles are float32, as openpi's JAX code and transformers'
    PI0 compute them; the highest frequency is ~1571, where one float32 step of the angle is
    1.2e-4. ``exact=True`` gives the sines of the float64 angles instead, as the torch ports
    of openpi (its own and lerobot's) compute them on every device: pi0.5's converted
    checkpoints come from those (`exact_angles`).
    """
    half = width // 2
    if exact:
        angle = exact_angles(t, np.geomspace(min_period, max_period, half))
    else:
        fraction = jnp.linspace(0.0, 1.0, half, dtype=jnp.float32)
        period = min_period * (max_period / min_period) ** fraction
        freq = 1.0 / period * 2 * jnp.pi
        angle = freq[None, :] * t.astype(jnp.float32)[:, None]
    return jnp.concatenate([jnp.sin(angle), jnp.cos(angle)], axis=-1)


def _twelve_bit_parts(x: np.ndarray, parts: int) -> list[np.ndarray]:
    """float64 ``x`` as a sum of ``parts`` float32 arrays of at most 12 significant bits each
    (what is left over is below 2^-36 of ``x``)."""
    out, rest = [], np.asarray(x, np.float64)
    for _ in range(parts):
        mantissa, exponent = np.frexp(rest)
        piece = np.ldexp(np.round(np.ldexp(mantissa, 12)), exponent - 12)
        out.append(piece.astype(np.float32))
        rest = rest - piece
    return out


def exact_angles(t: jax.Array, periods: np.ndarray) -> jax.Array:
    """``2 pi t / period [B, F]`` reduced to ``[-pi, pi]``, within a few float32 steps of the
    float64 angle, in float32 arithmetic (no x64 needed): the turns ``t / period`` as sums of exact products of 12-bit
    pieces of ``t`` and of ``1 / period``, each piece's whole turns dropped before adding."""
    t = t.astype(jnp.float32)[:, None]
    bits = jax.lax.bitcast_convert_type(t, jnp.uint32)
    t_hi = jax.lax.bitcast_convert_type(bits & jnp.uint32(0xFFFFF000), jnp.float32)  # 12 significant bits
    t_parts = (t_hi, t - t_hi)  # t_lo: the other 12, exact
    turns = jnp.zeros(t.shape[:1] + periods.shape, jnp.float32)
    for piece in _twelve_bit_parts(1.0 / periods, 3):
        for tp in t_parts:
            product = tp * jnp.asarray(piece)[None]  # 12 + 12 bits: exact in float32
            turns = turns + (product - jnp.round(product))
    return (turns - jnp.round(turns)) * np.float32(2 * np.pi)


def flow_fields(hf: dict) -> dict:
    """The chunk, state / action widths, denoising steps and time-embedding periods a pi0
    or pi0.5 config.json gives (both families name them alike), with openpi's defaults."""
    return {
        "chunk_size": int(hf.get("chunk_size", 50)),
        "max_state_dim": int(hf.get("max_state_dim", 32)),
        "max_action_dim": int(hf.get("max_action_dim", 32)),
        "num_steps": int(hf.get("num_inference_steps", 10)),
        "min_period": float(hf.get("min_period", 4e-3)),
        "max_period": float(hf.get("max_period", 4.0)),
    }


def check_flow_config(config) -> None:
    """What pi0's and pi0.5's configs both need: an expert that can share the prefix's
    attention layer by layer, an even width (the time embedding's sin / cos halves) and a
    valid flow-noise std range."""
    text, expert = config.paligemma.text, config.expert
    for name in ("num_layers", "num_kv_heads", "head_dim"):
        if getattr(text, name) != getattr(expert, name):
            raise BadInput(
                f"the action expert's {name}={getattr(expert, name)} differs from PaliGemma's "
                f"{getattr(text, name)}; shared attention needs them equal"
            )
    if expert.hidden_size % 2:
        raise BadInput(f"the action expert's hidden_size={expert.hidden_size} must be even (sin/cos halves)")
    lo, hi = config.noise_std_range
    if not 0 < lo <= hi:
        raise BadInput(f"noise_std_range={config.noise_std_range} must satisfy 0 < min <= max")


class FlowModel(nnx.Module):
    """Sampling, RL chains and the training loss over a subclass's ``outputs`` (module
    docstring). A subclass's constructor starts with `_build_towers` (``config`` with
    ``chunk_size``, ``max_action_dim``, ``num_steps``, ``noise_std_range``; ``paligemma``,
    ``expert``, ``suffix_length``: the expert's tokens per pass), builds its own projections
    with ``action_out_proj`` among them, and ends with `_build_rl_heads` (``value_head``,
    ``noise_head``, either may be None)."""

    def _build_towers(self, config, suffix_length: int, *, dtype, param_dtype, rngs, scan_layers: bool,
                      remat: str) -> dict:
        """The start of a subclass's constructor: its config, compute dtype and expert tokens
        per pass (``suffix_length``), then PaliGemma and the action expert (no token table: it
        reads only embeddings). ``scan_layers`` / ``remat``: every tower's and LM's blocks
        under lax.scan and a rematerialisation policy (see `CausalLM`); a scanned prefix's KV
        cache is stacked, as the expert's scanned layers read it. Returns the dtype / rngs
        keywords the subclass builds its own layers with."""
        kw = {"dtype": dtype, "param_dtype": param_dtype or dtype, "rngs": rngs}
        self.config, self.dtype, self.suffix_length = config, dtype, suffix_length
        layout = {"scan_layers": scan_layers, "remat": remat}
        self.paligemma = PaliGemma(config.paligemma, **layout, **kw)
        self.expert = CausalLM(config.expert, token_embeddings=False, **layout, **kw)
        return kw

    def _build_rl_heads(self, config, value_width: int, **kw) -> None:
        """The RL heads the config asks for: the value head on ``value_width`` features and
        the flow-noise std head on the expert's action outputs (None where not asked)."""
        E, A = config.expert.hidden_size, config.max_action_dim
        value, noise = config.value_hidden, config.noise_hidden
        self.value_head = MLPHead((value_width, *value, 1), jax.nn.gelu, **kw) if value else None
        self.noise_head = MLPHead((E, *noise, A), jnp.tanh, **kw) if noise else None

    # -- the prefix and the expert over it ---------------------------------------------

    def encode_prefix(self, input_ids, pixels, attention_mask, camera_mask=None) -> Prefix:
        """Run the prefix once: ``input_ids / attention_mask [B, P]``, ``pixels [B, cameras, ...]``.
        The cache has room for the ``suffix_length`` expert tokens after it."""
        B, P = input_ids.shape
        S = P + self.suffix_length
        valid = attention_mask.astype(bool)
        embeds = self.paligemma.embed_prefix(input_ids, pixels, camera_mask)
        key_valid = jnp.concatenate([valid, jnp.zeros((B, S - P), bool)], axis=1)
        # Bidirectional over the prefix; positions 0-based counts of real tokens.
        mask = jnp.broadcast_to((jnp.arange(S) < P)[None, None, :], (B, P, S))
        positions = jnp.cumsum(valid, axis=1, dtype=jnp.int32) - 1
        lm = self.paligemma.language_model
        hidden, cache = lm.hidden_states(
            attention_mask=key_valid,
            positions=positions,
            cache=lm.init_cache(B, S),
            cache_index=0,
            inputs_embeds=embeds,
            mask=mask,
        )
        weights = valid.astype(jnp.float32)[..., None]
        pooled = jnp.sum(hidden.astype(jnp.float32) * weights, 1) / jnp.maximum(jnp.sum(weights, 1), 1.0)
        return Prefix(cache, valid, pooled)

    def run_expert(self, prefix: Prefix, suffix: jax.Array, suffix_mask: jax.Array, cond=None) -> jax.Array:
        """The action expert's final-norm output ``[B, L, E]`` on ``suffix [B, L, E]``: each
        suffix token sees every real prefix token and the suffix tokens ``suffix_mask [L, L]``
        allows; its layer ``l`` attends over the prefix's layer-``l`` keys in the cache.
        ``cond`` conditions an expert with adaptive norms."""
        B, P = prefix.mask.shape
        L = suffix.shape[1]
        key_valid = jnp.concatenate([prefix.mask, jnp.ones((B, L), bool)], axis=1)
        mask = jnp.concatenate([jnp.ones((L, P), bool), suffix_mask], axis=1)
        positions = jnp.sum(prefix.mask, axis=1, dtype=jnp.int32)[:, None] + jnp.arange(L, dtype=jnp.int32)
        hidden, _ = self.expert.hidden_states(
            attention_mask=key_valid,
            positions=positions,
            cache=prefix.cache,
            cache_index=P,
            inputs_embeds=suffix,
            mask=jnp.broadcast_to(mask[None], (B, L, P + L)),
            cond=cond,
        )
        return hidden

    def outputs(self, prefix: Prefix, state, x_t, t):
        """(velocity ``[B, H, A]``, noise std ``[B, H, A]`` or None, value ``[B]``), float32."""
        raise NotImplementedError

    def action_heads(self, actions: jax.Array):
        """(velocity, noise std or None) from the expert's action outputs ``[B, H, E]``."""
        B, H, E = actions.shape
        v = self.action_out_proj(actions.reshape(B * H, E)).reshape(B, H, -1).astype(jnp.float32)
        return v, self.noise_std(actions)

    def noise_std(self, features: jax.Array) -> jax.Array | None:
        """The flow-noise std ``[B, H, A]`` from per-action ``features [B, H, W]``, squashed into
        ``noise_std_range`` (None without a noise head)."""
        if self.noise_head is None:
            return None
        B, H, W = features.shape
        lo, hi = (2 * np.log(s) for s in self.config.noise_std_range)  # log-variance bounds
        squashed = jnp.tanh(self.noise_head(features.reshape(B * H, W)).astype(jnp.float32)).reshape(B, H, -1)
        return jnp.exp(0.5 * (lo + (hi - lo) * (squashed + 1) / 2))

    def value_of(self, features: jax.Array) -> jax.Array:
        """``[B]`` value head on ``features [B, D]`` (zeros without a value head)."""
        if self.value_head is None:
            return jnp.zeros(features.shape[:1], jnp.float32)
        return self.value_head(features).astype(jnp.float32)[:, 0]

    def velocity(self, prefix: Prefix, state, x_t, t) -> jax.Array:
        """The velocity field ``v(x_t, t) [B, H, A]`` (float32)."""
        return self.outputs(prefix, state, x_t, t)[0]

    def value(self, prefix: Prefix, state) -> jax.Array:
        """``[B]`` value of the observation (a function of the observation alone)."""
        B = prefix.mask.shape[0]
        x = jnp.zeros((B, self.config.chunk_size, self.config.max_action_dim), jnp.float32)
        return self.outputs(prefix, state, x, jnp.ones((B,), jnp.float32))[2]

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
        temperature: float = 1.0,
    ) -> FlowSample:
        """A stochastic denoising chain with the log-density of its stochastic steps.

        flow-SDE: step ``stochastic_step [B]`` (uniform in ``0..N-1`` when not given) follows
        the SDE with ``noise_level``; the other steps are Euler steps. flow-noise: every step
        adds the noise head's std. ``noise`` is the chain's start (drawn when not given, a
        Gaussian of std ``temperature``; no log-prob counts it).
        """
        c = self.config
        N = num_steps or c.num_steps
        B = prefix.mask.shape[0]
        shape = (B, c.chunk_size, c.max_action_dim)
        k_noise, k_step, k_eps = jax.random.split(key, 3)
        if noise is None:
            noise = temperature * jax.random.normal(k_noise, shape, jnp.float32)
        x0 = noise.astype(jnp.float32)
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
        v, noise_std, value = self.outputs(prefix, state, x, t)
        delta = np.float32(1.0 / N)
        if method == flow_steps.FLOW_SDE:
            chosen = stochastic_step == k
            sigma = jnp.where(chosen, jnp.broadcast_to(jnp.asarray(sigma, jnp.float32), (B,)), 0.0)
            return (*flow_steps.sde_step(x, v, t[:, None, None], delta, sigma[:, None, None]), value)
        return x.astype(jnp.float32) - delta * v, noise_std, value

    def _require_noise_head(self):
        if self.noise_head is None:
            raise BadInput("flow-noise needs a noise head: build the model with noise_hidden=(...) in its config")

    # -- training ----------------------------------------------------------------------

    def training_times(self, key, n: int) -> jax.Array:
        """Flow-matching times ``t [n]`` as openpi draws them, ``Beta(1.5, 1) * 0.999 + 0.001``:
        favouring the noisy end, never exactly 0."""
        return jax.random.beta(key, 1.5, 1.0, (n,)) * 0.999 + 0.001

    def flow_matching_loss(self, prefix: Prefix, state, actions, noise, t) -> jax.Array:
        """Per-element squared error ``[B, H, A]`` of the velocity at
        ``x_t = t * noise + (1 - t) * actions`` against ``noise - actions`` (``t [B]``)."""
        t3 = t.astype(jnp.float32)[:, None, None]
        x_t = t3 * noise + (1 - t3) * actions
        return jnp.square(self.velocity(prefix, state, x_t, t) - (noise - actions))
