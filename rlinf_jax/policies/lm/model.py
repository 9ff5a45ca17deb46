"""The causal LM: embeddings, pre-norm decoder blocks (attention + gated MLP: SwiGLU, or
tanh-GELU for Gemma), final norm, output head (own or tied to the embeddings).

Call it as ``model(input_ids, attention_mask)`` for logits ``[B, T, V]`` (float32 whatever the
compute dtype, since log-probs for RL are taken from them). Positions follow the attention
mask (``cumsum - 1``), so left-padded batches give each row the numbers it would get alone.
With ``cache=`` and ``cache_index=`` the same call runs prefill / decode steps on a static KV
cache and returns ``(logits, new_cache)``. ``hidden_states`` gives the final-norm hidden states
for heads that sit on the LM (a value head).

The blocks are unrolled (one copy per layer in the compiled program) or, with
``scan_layers=True``, stacked and run under ``lax.scan`` so that compile time does not grow with
depth (`policies.lm.layout`); ``remat`` names what each block keeps for the backward pass.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from rlinf_jax import kernels
from rlinf_jax.errors import BadInput
from rlinf_jax.kernels import mkl
from rlinf_jax.policies.lm.attention import Attention, KVCache, attention_mask_3d
from rlinf_jax.policies.lm.config import LMConfig
from rlinf_jax.policies.lm.layers import AdaRMSNorm, Dense, Embed, RMSNorm, gated, rope_tables
from rlinf_jax.policies.lm.layout import stack_flat, stack_variables, unstack_flat

# What each decoder block keeps of its forward pass for the backward pass (``jax.checkpoint``):
# "none" keeps everything autodiff wants (no recomputation); "full" keeps only the block's
# input and recomputes the rest; "dots" keeps the outputs of the projections (XLA matrix
# products without batch dimensions: q/k/v/o and the MLP's) and recomputes norms, RoPE, the
# attention products and softmax, and the activations between them. (Products through the MKL
# backend are custom calls, not dots: "dots" recomputes them too.)
REMAT_POLICIES = ("none", "full", "dots")


def check_remat(remat: str) -> None:
    if remat not in REMAT_POLICIES:
        raise BadInput(f"remat={remat!r} is not a rematerialisation policy; choose one of {', '.join(REMAT_POLICIES)}")


def checkpointed(fn, remat: str, prevent_cse: bool = True):
    """``fn`` under ``jax.checkpoint`` with the policy ``remat`` names (``fn`` itself for "none")."""
    check_remat(remat)
    if remat == "none":
        return fn
    policy = jax.checkpoint_policies.dots_with_no_batch_dims_saveable if remat == "dots" else None
    return jax.checkpoint(fn, policy=policy, prevent_cse=prevent_cse)


class MLP(nnx.Module):
    """Gated MLP ``down(act(gate(x)) * up(x))``: SiLU (SwiGLU), or for Gemma the tanh
    approximation of GELU (GeGLU)."""

    def __init__(self, config: LMConfig, *, dtype, param_dtype, rngs, matmul="xla"):
        kw = {"use_bias": config.mlp_bias, "dtype": dtype, "param_dtype": param_dtype, "rngs": rngs, "matmul": matmul}
        d, f = config.hidden_size, config.intermediate_size
        self.gelu = config.is_gemma
        self.gate_proj = Dense(d, f, ("embed", "mlp"), **kw)
        self.up_proj = Dense(d, f, ("embed", "mlp"), **kw)
        self.down_proj = Dense(f, d, ("mlp", "embed"), **kw)

    def __call__(self, x):
        gate, up = self.gate_proj(x), self.up_proj(x)
        if self.gelu:
            return self.down_proj(jax.nn.gelu(gate, approximate=True) * up)
        if self.down_proj.matmul == "mkl" and gate.dtype == jnp.float32:
            return self.down_proj(mkl.swiglu(gate, up))  # one pass in the kernel library
        return self.down_proj(swiglu(gate, up))


@jax.custom_vjp
def swiglu(gate: jax.Array, up: jax.Array) -> jax.Array:
    """``silu(gate) * up``, with a backward pass written out.

    Autodiff keeps ``sigmoid(gate)`` and ``silu(gate)`` for the backward pass, so XLA CPU wrote
    both out and ran the forward as three passes over ``[tokens, intermediate]`` (and the
    backward as several more). Here the forward is one pass and the backward one pass that
    recomputes the sigmoid from ``gate``.
    """
    return _swiglu(gate, up)


def _swiglu(gate, up):
    g = gate.astype(jnp.float32)
    return (g * jax.nn.sigmoid(g) * up.astype(jnp.float32)).astype(up.dtype)


def _swiglu_fwd(gate, up):
    return _swiglu(gate, up), (gate, up)


def _swiglu_bwd(residuals, dh):
    # The barrier keeps XLA from merging this sigmoid with the forward's (common
    # subexpressions), which would write the forward's intermediates out again.
    gate, up = jax.lax.optimization_barrier(residuals)
    g, u, dh = gate.astype(jnp.float32), up.astype(jnp.float32), dh.astype(jnp.float32)
    sig = jax.nn.sigmoid(g)
    silu = g * sig
    d_gate = dh * u * (sig + silu * (1.0 - sig))  # d silu / d g = sig * (1 + g * (1 - sig))
    return d_gate.astype(gate.dtype), (dh * silu).astype(up.dtype)


swiglu.defvjp(_swiglu_fwd, _swiglu_bwd)


def make_norm(config: LMConfig, **kw):
    """The model's RMSNorm, or an `AdaRMSNorm` when ``config.adarms_cond_dim`` is set."""
    if config.adarms_cond_dim:
        return AdaRMSNorm(config.hidden_size, config.adarms_cond_dim, eps=config.rms_norm_eps, **kw)
    return RMSNorm(config.hidden_size, eps=config.rms_norm_eps, unit_offset=config.is_gemma, **kw)


def apply_norm(norm, h, cond, batch: int):
    """(normalised ``h [batch * T, E]``, residual gate or None) for either kind of norm;
    ``cond`` must be ``[batch, cond_dim]`` for an adaptive one and None for a plain one."""
    if not isinstance(norm, AdaRMSNorm):
        if cond is not None:
            raise BadInput("cond= conditions adaptive norms; this model's are plain (adarms_cond_dim is 0)")
        return norm(h), None
    if cond is None:
        raise BadInput("this model's norms are adaptive (adarms_cond_dim is set): pass cond=")
    if cond.shape != (batch, norm.dense.kernel.shape[0]):
        raise BadInput(f"cond has shape {tuple(cond.shape)}; the adaptive norms need "
                       f"[batch={batch}, cond_dim={norm.dense.kernel.shape[0]}]")
    return norm(h, cond)


class Block(nnx.Module):
    def __init__(self, config: LMConfig, *, dtype, param_dtype, rngs, matmul="xla"):
        kw = {"dtype": dtype, "param_dtype": param_dtype, "rngs": rngs}
        self.attn_norm = make_norm(config, **kw)
        self.attn = Attention(config, matmul=matmul, **kw)
        self.mlp_norm = make_norm(config, **kw)
        self.mlp = MLP(config, matmul=matmul, **kw)

    def __call__(self, h, batch, length, rope, mask, kv=None, cache_index=None, query_cols=None, layer=None,
                 cond=None):
        """``h [B*T, embed]`` -> ``[B*Q, embed]``: ``Q = T``, or the columns ``query_cols``
        names (``(start, Q)``; ``layer``: ``kv`` is the stacked cache, see `Attention`).
        ``cond [B, C]`` conditions adaptive norms, whose gates scale each branch."""
        x, gate = apply_norm(self.attn_norm, h, cond, batch)
        a, new_kv = self.attn(x, batch, length, rope, mask, kv, cache_index, query_cols, layer)
        if query_cols is not None:
            start, n = query_cols
            h = h.reshape(batch, length, -1)[:, start : start + n].reshape(batch * n, -1)
        h = h + gated(a, gate)
        x, gate = apply_norm(self.mlp_norm, h, cond, batch)
        h = h + gated(self.mlp(x), gate)
        return h, new_kv


class CausalLM(nnx.Module):
    """Llama 2/3, Qwen2/2.5, Qwen3 and Gemma decoder-only LM.

    ``dtype`` is the compute dtype, ``param_dtype`` (default: ``dtype``) the storage dtype.
    Norms, RoPE, attention scores, softmax and logits run in float32 either way.
    ``matmul`` names the backend of every matrix product (`rlinf_jax.kernels`): ``xla``, or
    ``mkl`` (Intel MKL on one CPU device; its caller checks it with ``kernels.check_backend``).

    ``token_embeddings=False`` builds the decoder stack alone (no embedding table, no output
    head): a backbone that is only ever fed ``inputs_embeds``, such as pi0's action expert,
    need not carry a vocabulary-sized table it never reads.

    ``scan_layers=True`` stacks the blocks' parameters on a leading layer axis (``layers``
    holds one `Block` of ``[num_layers, ...]`` arrays) and runs them under ``lax.scan``; the
    same seed gives the same weights in either layout (`relayout` converts a model). ``remat``
    is one of `REMAT_POLICIES`, applied to each block in either layout.
    """

    def __init__(
        self,
        config: LMConfig,
        *,
        dtype=jnp.float32,
        param_dtype=None,
        rngs: nnx.Rngs,
        token_embeddings: bool = True,
        matmul: str = "xla",
        scan_layers: bool = False,
        remat: str = "none",
    ):
        param_dtype = param_dtype or dtype
        check_remat(remat)
        self.config = config
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.matmul = matmul
        self.scan_layers = bool(scan_layers)
        self.remat = remat
        kw = {"dtype": dtype, "param_dtype": param_dtype, "rngs": rngs}
        scale = config.hidden_size**0.5 if config.is_gemma else None
        self.embed = (
            Embed(config.vocab_size, config.hidden_size, scale=scale, matmul=matmul, **kw) if token_embeddings else None
        )
        blocks = [Block(config, matmul=matmul, **kw) for _ in range(config.num_layers)]
        if self.scan_layers:
            # Built one by one and stacked, so a seed gives the unrolled model's weights.
            graphdef = nnx.graphdef(blocks[0])
            self.layers = nnx.merge(graphdef, stack_variables([nnx.state(b) for b in blocks]))
        else:
            self.layers = nnx.List(blocks)
        self.final_norm = make_norm(config, **kw)
        if config.tie_word_embeddings or not token_embeddings:
            self.lm_head = None
        else:
            self.lm_head = Dense(
                config.hidden_size, config.vocab_size, ("embed", "vocab"), use_bias=False, matmul=matmul, **kw
            )

    def init_cache(self, batch: int, max_len: int, dtype=None) -> KVCache:
        """An empty static KV cache for ``batch`` rows of up to ``max_len`` tokens."""
        return KVCache.zeros(self.config, batch, max_len, dtype or self.dtype, stacked=self.scan_layers)

    def hidden_states(
        self,
        input_ids=None,
        attention_mask=None,
        positions=None,
        cache=None,
        cache_index=None,
        *,
        inputs_embeds=None,
        mask=None,
        output_cols=None,
        cond=None,
    ):
        """Final-norm hidden states ``[B, T, embed]`` (and the new cache when ``cache`` is given).

        ``output_cols = (start, n)`` returns only columns ``start .. start + n - 1``,
        ``[B, n, embed]``: the last layer then runs its queries, output projection and MLP on
        those columns alone (every earlier layer is still needed at all columns, for keys and
        values). A trainer that scores only the response saves the last layer's prompt work;
        a prefill that reads only the last column (into a cache, whose keys and values are
        still written for every column) saves the rest of that layer.

        Without a cache, ``attention_mask`` is ``[B, T]`` (1 = real token). With a cache it
        covers every cache slot, ``[B, S]``, and the ``T`` new tokens go to slots
        ``cache_index .. cache_index + T - 1``. ``positions [B, T]`` default to the count of
        real tokens before each one.

        Multimodal models pass ``inputs_embeds [B, T, embed]`` (e.g. projected image patches
        followed by embedded text) instead of ``input_ids``, and a full ``mask [B, T, S]``
        (query may see key) where the causal one does not fit: bidirectional prefixes or
        action slots. ``attention_mask`` still decides positions and which keys are real.

        ``cond [B, adarms_cond_dim]`` is the conditioning of a model with adaptive norms
        (`AdaRMSNorm`: pi0.5's action expert, conditioned on the flow time).
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        B, T = input_ids.shape if inputs_embeds is None else inputs_embeds.shape[:2]
        if cache is None:
            key_valid = jnp.ones((B, T), bool) if attention_mask is None else attention_mask.astype(bool)
            query_slots = jnp.arange(T)
            counts = jnp.cumsum(key_valid, axis=1, dtype=jnp.int32) - 1
        else:
            if cache_index is None:
                raise ValueError("cache_index is required with a cache")
            S = cache.max_len
            key_valid = jnp.ones((B, S), bool) if attention_mask is None else attention_mask.astype(bool)
            query_slots = cache_index + jnp.arange(T)
            counts = jnp.cumsum(key_valid, axis=1, dtype=jnp.int32) - 1
            counts = jax.lax.dynamic_slice_in_dim(counts, cache_index, T, axis=1)
        inv_freq = self.config.rope.inv_freq(self.config.head_dim)
        if positions is None:
            # Counts of real tokens: each below the number of key slots, so the tables can be
            # built once per position.
            rope = rope_tables(jnp.maximum(counts, 0), inv_freq, num_positions=key_valid.shape[1])
        else:
            rope = rope_tables(positions, inv_freq)
        if mask is None:
            mask = attention_mask_3d(key_valid, query_slots)
        else:
            mask = mask.astype(bool) & key_valid[:, None, :]

        if inputs_embeds is None:
            # Gemma's sqrt(hidden) scaling lives in the embedding lookup, as in transformers:
            # inputs_embeds (image features, action tokens) go in unscaled.
            h = self.embed(input_ids.reshape(B * T))
        else:
            h = inputs_embeds.reshape(B * T, -1).astype(self.dtype)
        if output_cols is not None:
            output_cols = (int(output_cols[0]), int(output_cols[1]))
            if output_cols[0] < 0 or output_cols[1] < 1 or sum(output_cols) > T:
                raise ValueError(f"output_cols={output_cols} must lie inside the {T} input columns")
        ctx = {"batch": B, "length": T, "rope": rope, "mask": mask, "cache_index": cache_index, "cond": cond}
        if self.scan_layers:
            h, new_cache = self._scanned_layers(h, cache, ctx)
            if output_cols is not None:
                # Every layer ran at every column: the last one's extra columns cost 1 / L of the
                # stack, where a last layer run apart would need its weights sliced out of the
                # stacked arrays, a copy of every layer's weights in each call.
                start, n = output_cols
                h = h.reshape(B, T, -1)[:, start : start + n].reshape(B * n, -1)
        else:
            h, new_cache = self._unrolled_layers(h, cache, ctx, output_cols)
        h = apply_norm(self.final_norm, h, cond, B)[0].reshape(B, T if output_cols is None else output_cols[1], -1)
        if cache is None:
            return h
        return h, new_cache

    def _block(self, graphdef, *, batch, length, rope, mask, cache_index, cond=None, query_cols=None,
               prevent_cse=True):
        """``(block state, h, kv, layer=None) -> (h, new kv)``: a block of structure ``graphdef``
        under the model's remat policy."""

        def apply(state, h, kv, layer=None):
            return nnx.merge(graphdef, state)(h, batch, length, rope, mask, kv, cache_index, query_cols, layer,
                                              cond=cond)

        return checkpointed(apply, self.remat, prevent_cse)

    def _unrolled_layers(self, h, cache, ctx, output_cols):
        new_keys, new_values = [], []
        last = self.config.num_layers - 1
        for i, layer in enumerate(self.layers):
            graphdef, state = nnx.split(layer)
            kv = None if cache is None else (cache.keys[i], cache.values[i])
            block = self._block(graphdef, query_cols=output_cols if i == last else None, **ctx)
            h, new_kv = block(state, h, kv)
            if new_kv is not None:
                new_keys.append(new_kv[0])
                new_values.append(new_kv[1])
        return h, (None if cache is None else KVCache(tuple(new_keys), tuple(new_values)))

    def _scanned_layers(self, h, cache, ctx):
        graphdef, stacked = nnx.split(self.layers)
        # A loop body's recomputation cannot be merged with the forward pass it repeats (they
        # are different loops), so the checkpoint's own guard against that is not needed.
        block = self._block(graphdef, prevent_cse=False, **ctx)
        if cache is None:
            h, _ = jax.lax.scan(lambda h, state: (block(state, h, None)[0], None), h, stacked)
            return h, None

        def step(carry, xs):
            # The whole cache rides in the carry, so a donated cache is updated in place. Without
            # remat each layer writes its new columns straight into it (`Attention`'s
            # ``layer``); a checkpointed block must not take the whole cache as an input (its
            # inputs are kept for the backward pass, a copy per layer), so it gets its layer's
            # slice, which is written back whole.
            h, keys, values = carry
            state, i = xs
            if self.remat == "none":
                h, (keys, values) = block(state, h, (keys, values), i)
                return (h, keys, values), None
            kv = (jax.lax.dynamic_index_in_dim(keys, i, keepdims=False),
                  jax.lax.dynamic_index_in_dim(values, i, keepdims=False))
            h, (k, v) = block(state, h, kv)
            keys = jax.lax.dynamic_update_index_in_dim(keys, k, i, 0)
            values = jax.lax.dynamic_update_index_in_dim(values, v, i, 0)
            return (h, keys, values), None

        layers = jnp.arange(self.config.num_layers)
        (h, keys, values), _ = jax.lax.scan(step, (h, cache.keys, cache.values), (stacked, layers))
        return h, KVCache(keys, values)

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Float32 logits ``[..., vocab]`` from hidden states ``[..., embed]``."""
        lead = hidden.shape[:-1]
        h = hidden.reshape(-1, hidden.shape[-1])
        if self.embed is None:
            raise ValueError("this model was built with token_embeddings=False: it has no output head")
        if self.lm_head is None:
            out = self.embed.attend(h)
        else:
            out = kernels.matmul(h.astype(self.dtype), self.lm_head.kernel[...].astype(self.dtype), self.matmul)
        return out.reshape(*lead, -1)

    def __call__(self, input_ids, attention_mask=None, positions=None, cache=None, cache_index=None):
        out = self.hidden_states(input_ids, attention_mask, positions, cache, cache_index)
        if cache is None:
            return self.logits(out)
        hidden, new_cache = out
        return self.logits(hidden), new_cache


def set_matmul(model: nnx.Module, backend: str) -> None:
    """Routes every matrix product of ``model`` (loaded or built with another backend)
    through ``backend``; programs traced afterwards use it."""
    for _, module in nnx.iter_modules(model):
        if hasattr(module, "matmul"):
            module.matmul = backend


def without_remat(model: CausalLM) -> CausalLM:
    """``model`` (the same arrays) without rematerialisation: for programs that are never
    differentiated, such as a sampler's, where it saves nothing and a checkpointed scanned
    block writes its whole cache slice back instead of the new columns."""
    copy = nnx.merge(*nnx.split(model))
    copy.remat = "none"
    return copy


def relayout(model: CausalLM, scan_layers: bool) -> CausalLM:
    """``model`` with its blocks unrolled (``scan_layers=False``) or stacked for a scan: the
    same weights, dtypes, product backend and remat policy (``model`` itself when it is
    already in that layout)."""
    if model.scan_layers == bool(scan_layers):
        return model
    flat = {".".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(nnx.state(model))}
    flat = stack_flat(flat, model.config.num_layers) if scan_layers else unstack_flat(flat)
    abstract = nnx.eval_shape(lambda: CausalLM(
        model.config, dtype=model.dtype, param_dtype=model.param_dtype, rngs=nnx.Rngs(0),
        token_embeddings=model.embed is not None, matmul=model.matmul, scan_layers=scan_layers, remat=model.remat,
    ))
    graphdef, state = nnx.split(abstract)
    variables = nnx.to_flat_state(state)
    for path, var in variables:
        var.set_value(flat[".".join(map(str, path))])
    return nnx.merge(graphdef, nnx.from_flat_state(variables))
