"""The NNX causal LM on its own: logical axis names, the KV-cache path against the plain
forward pass, hidden states, and finite gradients on padded batches."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlinf_jax.kernels import mkl
from rlinf_jax.policies.lm import CausalLM, LMConfig, RopeConfig

P = jax.sharding.PartitionSpec


def tiny_config(**kw):
    base = {
        "model_type": "qwen3", "vocab_size": 53, "hidden_size": 40, "intermediate_size": 56, "num_layers": 2,
        "num_heads": 6, "num_kv_heads": 2, "head_dim": 12, "qk_norm": True, "attention_bias": True,
        "rope": RopeConfig(theta=1000.0),
    }
    return LMConfig(**{**base, **kw})


def random_model(config, seed=0, dtype=jnp.float32):
    model = CausalLM(config, dtype=dtype, rngs=nnx.Rngs(seed))
    # Non-trivial norms and biases, so every parameter matters.
    state = nnx.state(model, nnx.Param)
    keys = iter(jax.random.split(jax.random.key(seed + 1), len(jax.tree.leaves(state))))
    noisy = jax.tree.map(lambda x: x + 0.1 * jax.random.normal(next(keys), x.shape, x.dtype), state)
    nnx.update(model, noisy)
    return model


@jax.jit
def forward(model, ids, mask=None, positions=None):
    return model(ids, mask, positions)


def test_every_parameter_has_logical_axis_names():
    model = random_model(tiny_config(tie_word_embeddings=False, model_type="llama", qk_norm=False))
    specs = nnx.to_flat_state(nnx.get_partition_spec(nnx.state(model, nnx.Param)))
    allowed = {"vocab", "embed", "mlp", "q_heads", "kv_heads", "head_dim", "norm"}
    by_path = {".".join(map(str, p)): v.get_value() for p, v in specs}
    for path, spec in by_path.items():
        assert isinstance(spec, P) and spec and set(spec) <= allowed, (path, spec)
    expected = {
        "embed.embedding": P("vocab", "embed"),
        "lm_head.kernel": P("embed", "vocab"),
        "layers.0.attn.q_proj.kernel": P("embed", "q_heads"),
        "layers.0.attn.q_proj.bias": P("q_heads"),
        "layers.0.attn.k_proj.kernel": P("embed", "kv_heads"),
        "layers.0.attn.o_proj.kernel": P("q_heads", "embed"),
        "layers.1.mlp.gate_proj.kernel": P("embed", "mlp"),
        "layers.1.mlp.down_proj.kernel": P("mlp", "embed"),
        "layers.1.attn_norm.scale": P("norm"),
        "final_norm.scale": P("norm"),
    }
    for path, spec in expected.items():
        assert by_path[path] == spec, path


@pytest.mark.parametrize("tied", [True, False])
def test_cached_prefill_and_decode_equal_full_forward(tied):
    model = random_model(tiny_config(tie_word_embeddings=tied))
    B, P_len, S = 3, 5, 16
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, 53, (B, S)), jnp.int32)
    mask = np.ones((B, S), bool)
    mask[1, :3] = False  # left padding in the prompt
    mask[2, :1] = False
    mask = jnp.asarray(mask)
    full = np.asarray(forward(model, ids, mask))

    cache = model.init_cache(B, S)
    step = jax.jit(lambda m, t, c, i: m(t, mask, cache=c, cache_index=i))
    logits, cache = step(model, ids[:, :P_len], cache, 0)
    got = [np.asarray(logits)]
    for i in range(P_len, S):
        logits, cache = step(model, ids[:, i : i + 1], cache, i)
        got.append(np.asarray(logits))
    got = np.concatenate(got, axis=1)
    valid = np.asarray(mask)
    np.testing.assert_allclose(got[valid], full[valid], atol=2e-5)
    assert cache.keys[0].shape == (B, 2, 12, S)
    assert cache.values[0].shape == (B, 2, S, 12)
    # A prefill that reads only its last column fills the same cache.
    last, short = model.hidden_states(ids[:, :P_len], mask, cache=model.init_cache(B, S), cache_index=0,
                                      output_cols=(P_len - 1, 1))
    np.testing.assert_allclose(np.asarray(model.logits(last))[:, 0], full[:, P_len - 1], atol=2e-5)
    # Two programs compiled apart may sum in another order: a few ulps of slack.
    _, filled = step(model, ids[:, :P_len], model.init_cache(B, S), 0)
    for a, b in zip(jax.tree.leaves(short), jax.tree.leaves(filled)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=3e-6)


def test_hidden_states_feed_logits_and_positions_follow_mask():
    model = random_model(tiny_config())
    ids = jnp.asarray(np.random.default_rng(1).integers(0, 53, (2, 7)), jnp.int32)
    mask = jnp.asarray([[0, 0, 1, 1, 1, 1, 1], [1] * 7], bool)
    hidden, from_hidden = jax.jit(lambda m: (m.hidden_states(ids, mask), m.logits(m.hidden_states(ids, mask))))(model)
    assert hidden.shape == (2, 7, 40)
    np.testing.assert_allclose(np.asarray(from_hidden), np.asarray(forward(model, ids, mask)), atol=1e-6)
    explicit = jnp.asarray([[0, 0, 0, 1, 2, 3, 4], list(range(7))])
    np.testing.assert_allclose(
        np.asarray(forward(model, ids, mask, explicit)), np.asarray(forward(model, ids, mask)), atol=1e-6
    )


def test_output_cols_equal_the_full_pass_sliced_in_values_and_gradients():
    # The last layer then runs on the named columns only; every number must be the full
    # pass's, and so must the gradients a trainer takes through those columns.
    model = random_model(tiny_config())
    ids = jnp.asarray(np.random.default_rng(3).integers(0, 53, (2, 9)), jnp.int32)
    mask = jnp.asarray([[0, 0, 1, 1, 1, 1, 1, 1, 1], [1] * 9], bool)
    weights = jnp.asarray(np.random.default_rng(4).normal(size=(2, 4, 40)), jnp.float32)

    def full(m):
        return m.hidden_states(ids, mask)[:, 3:7]

    def cols(m):
        return m.hidden_states(ids, mask, output_cols=(3, 4))

    np.testing.assert_allclose(np.asarray(jax.jit(cols)(model)), np.asarray(jax.jit(full)(model)), atol=1e-5)
    g_full = jax.jit(nnx.grad(lambda m: jnp.sum(full(m) * weights)))(model)
    g_cols = jax.jit(nnx.grad(lambda m: jnp.sum(cols(m) * weights)))(model)
    for a, b in zip(jax.tree.leaves(g_full), jax.tree.leaves(g_cols)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="output_cols"):
        model.hidden_states(ids, mask, output_cols=(6, 4))


def test_gradients_are_finite_with_fully_masked_rows():
    model = random_model(tiny_config())
    ids = jnp.zeros((2, 6), jnp.int32)
    mask = jnp.asarray([[0, 0, 0, 1, 1, 1], [0] * 6], bool)

    def loss(m):
        logp = jax.nn.log_softmax(m(ids, mask))
        return -(logp[..., 1] * mask).sum()

    grads = jax.jit(nnx.grad(loss))(model)
    leaves = jax.tree.leaves(grads)
    assert all(bool(jnp.isfinite(g).all()) for g in leaves)
    assert any(float(jnp.abs(g).max()) > 0 for g in leaves)


def test_bf16_compute_keeps_logits_fp32_and_close():
    cfg = tiny_config()
    model32 = random_model(cfg)
    model16 = random_model(cfg, dtype=jnp.bfloat16)
    nnx.update(model16, jax.tree.map(lambda x: x.astype(jnp.bfloat16), nnx.state(model32, nnx.Param)))
    ids = jnp.asarray(np.random.default_rng(2).integers(0, 53, (2, 9)), jnp.int32)
    a, b = np.asarray(forward(model32, ids)), np.asarray(forward(model16, ids))
    assert b.dtype == np.float32
    assert np.abs(a - b).max() <= 0.05 * np.abs(a).max()


def test_inputs_embeds_and_explicit_mask_match_ids_and_causal_mask():
    model = random_model(tiny_config())
    ids = jnp.array([[3, 7, 1, 9, 4], [0, 0, 5, 2, 8]])
    valid = jnp.array([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    ref = model.hidden_states(ids, valid)
    embeds = model.embed(ids.reshape(-1)).reshape(2, 5, -1)
    causal = jnp.tril(jnp.ones((5, 5), bool))[None].repeat(2, axis=0)
    got = model.hidden_states(attention_mask=valid, inputs_embeds=embeds, mask=causal)
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=1e-6)
    # A bidirectional mask lets the first token see the last: its state must change.
    full = jnp.ones((2, 5, 5), bool)
    bidir = model.hidden_states(ids, valid, mask=full)
    assert float(jnp.abs(bidir[0, 0] - ref[0, 0]).max()) > 1e-4
    with pytest.raises(ValueError, match="exactly one"):
        model.hidden_states(ids, valid, inputs_embeds=embeds)


def test_tied_logits_gradients_equal_autodiffs():
    """The tied output head's hand-written backward (chosen for the form of the table's
    gradient) gives autodiff's gradients, in float32 and in bfloat16 compute."""
    from rlinf_jax.policies.lm.layers import tied_logits

    key = jax.random.key(3)
    x = jax.random.normal(key, (24, 16))
    table = jax.random.normal(jax.random.fold_in(key, 1), (40, 16))
    w = jax.random.normal(jax.random.fold_in(key, 2), (24, 40))

    def grads(head, dtype):
        loss = lambda x, t: jnp.sum(jnp.sin(head(x.astype(dtype), t.astype(dtype))) * w)  # noqa: E731
        return jax.grad(loss, argnums=(0, 1))(x, table)

    plain = lambda x, t: jnp.dot(x, t.T, preferred_element_type=jnp.float32)  # noqa: E731
    for dtype, tol in ((jnp.float32, 1e-5), (jnp.bfloat16, 0.15)):
        np.testing.assert_allclose(np.asarray(tied_logits(x.astype(dtype), table.astype(dtype))),
                                   np.asarray(plain(x.astype(dtype), table.astype(dtype))), rtol=1e-6)
        for got, want in zip(grads(tied_logits, dtype), grads(plain, dtype)):
            np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), atol=tol)


def test_swiglu_and_bias_gradients_equal_autodiffs():
    """The MLP's ``silu(gate) * up`` and the dense layers' bias add carry hand-written
    backward passes (for XLA CPU's fusions); their values and gradients are autodiff's of
    the plain expressions, in float32 and in bfloat16 compute; the bias add also in its
    per-member form (``[N, rows, F] + [N, 1, F]``, the off-policy ensembles)."""
    from rlinf_jax.kernels import add_bias
    from rlinf_jax.policies.lm.model import swiglu

    key = jax.random.key(4)
    gate, up, w = (jax.random.normal(jax.random.fold_in(key, i), (24, 16)) * 3 for i in range(3))
    bias = jax.random.normal(jax.random.fold_in(key, 3), (16,))
    plain_swiglu = lambda g, u: (jax.nn.silu(g.astype(jnp.float32)) * u.astype(jnp.float32)).astype(u.dtype)  # noqa: E731
    members = gate.reshape(2, 12, 16), bias.reshape(2, 1, 8).repeat(2, axis=-1)
    pairs = [(swiglu, plain_swiglu, (gate, up)), (add_bias, lambda y, b: y + b, (gate, bias)),
             (add_bias, lambda y, b: y + b, members)]
    for dtype, tol in ((jnp.float32, 1e-5), (jnp.bfloat16, 0.05)):
        for ours, plain, args in pairs:
            args = tuple(a.astype(dtype) for a in args)
            np.testing.assert_allclose(np.asarray(ours(*args), np.float32), np.asarray(plain(*args), np.float32),
                                       rtol=tol)

            def grads(f):
                loss = lambda *a: jnp.sum(jnp.sin(f(*a).astype(jnp.float32)).reshape(w.shape) * w)  # noqa: E731
                return jax.grad(loss, argnums=(0, 1))(*args)

            for got, want in zip(grads(ours), grads(plain)):
                assert got.dtype == want.dtype == dtype
                scale = float(jnp.max(jnp.abs(want.astype(jnp.float32))))
                np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                                           atol=tol * scale)


@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize(
    "backend", ["xla", pytest.param("mkl", marks=pytest.mark.skipif(not mkl.available(), reason="MKL is not installed"))]
)
def test_token_logprobs_and_entropy_against_a_naive_softmax(backend, temperature):
    """Log-probs, entropy and their gradients against log_softmax + gather on a hand-made
    batch, with and without a temperature, including a row whose tail underflows to
    probability 0; XLA's passes and the kernel library's row pass (``backend="mkl"``)."""
    from rlinf_jax.policies.lm.logprobs import token_logprobs

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 11)).astype(np.float32) * 3
    logits[1, 2, :5] = -1e4  # exp underflows: p = 0 there, and H must stay finite
    tokens = rng.integers(0, 11, (2, 3))
    tokens[1, 2] = 7
    T = temperature

    def naive(x, t):
        logp_all = jax.nn.log_softmax(x / T, axis=-1)
        p = jnp.exp(logp_all)
        return (jnp.take_along_axis(logp_all, t[..., None], axis=-1)[..., 0],
                -jnp.sum(jnp.where(p > 0, p * logp_all, 0.0), axis=-1))

    ours = lambda x: token_logprobs(x, jnp.asarray(tokens), T, backend)  # noqa: E731
    got, want = ours(jnp.asarray(logits)), naive(jnp.asarray(logits), tokens)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-5)
    # A hand check of one entry: log p = x_t / T - log sum exp(x / T).
    x = logits[0, 1].astype(np.float64) / T
    assert float(got[0][0, 1]) == pytest.approx(x[tokens[0, 1]] - np.log(np.exp(x).sum()), abs=1e-5)
    loss = lambda fn: lambda x: jnp.sum(fn(x)[0] * 0.3 + fn(x)[1])  # noqa: E731
    g_got = jax.grad(loss(ours))(jnp.asarray(logits))
    g_want = jax.grad(loss(lambda x: naive(x, tokens)))(jnp.asarray(logits))
    np.testing.assert_allclose(np.asarray(g_got), np.asarray(g_want), atol=1e-5)
    # Only the log-probs' gradient (the entropy's cotangent is a symbolic zero), under jit.
    g_lp = jax.jit(jax.grad(lambda x: jnp.sum(ours(x)[0])))(jnp.asarray(logits))
    g_lp_want = jax.grad(lambda x: jnp.sum(naive(x, tokens)[0]))(jnp.asarray(logits))
    np.testing.assert_allclose(np.asarray(g_lp), np.asarray(g_lp_want), atol=1e-5)
