"""Log-probabilities over the vocabulary in chunks (``actor.model.logits_chunk``): the same
log-probs, entropies and gradients as the whole-vocabulary path, in a fraction of its
memory, and threaded through the sft and reasoning updates."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlinf_jax.config import load_config
from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm.logprobs import chunked_token_logprobs, output_head, policy_logprobs, token_logprobs
from rlinf_jax.tasks.sft import config as sft_config
from tests.test_lm_model import random_model, tiny_config

VOCAB = 53  # tiny_config's: prime, so no chunk size but 1 and 53 divides it


def _batch(seed=0, B=3, P=4, N=6):
    rng = np.random.default_rng(seed)
    prompt_mask = np.ones((B, P), np.int32)
    prompt_mask[0, :2] = 0  # a left-padded prompt
    response_mask = np.ones((B, N), np.int32)
    response_mask[1, 4:] = 0  # a short response
    return {
        "prompt_ids": jnp.asarray(rng.integers(0, VOCAB, (B, P))),
        "prompt_mask": jnp.asarray(prompt_mask),
        "tokens": jnp.asarray(rng.integers(0, VOCAB, (B, N))),
        "response_mask": jnp.asarray(response_mask),
    }


@pytest.mark.parametrize("tied, temperature, chunk", [
    (True, 0.7, 8), (False, 0.7, 8), (True, 1.0, 16), (False, 0.7, 1), (True, 0.7, VOCAB), (False, 1.0, 64),
])
def test_chunked_head_equals_the_whole_vocabulary(tied, temperature, chunk):
    """Log-probs, entropies and their gradients with respect to the hidden states and the
    head's weights (tied table or lm_head kernel) equal the unchunked path's in float32;
    chunks of 8 and 16 leave a remainder of 53 columns, 64 is wider than the vocabulary."""
    model = random_model(tiny_config(tie_word_embeddings=tied))
    rng = np.random.default_rng(1)
    hidden = jnp.asarray(rng.normal(size=(3, 5, 40)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, VOCAB, (3, 5)))
    weights, axis = output_head(model)
    assert weights.shape[axis] == VOCAB and axis == (0 if tied else 1)
    g_logp = jnp.asarray(rng.normal(size=(3, 5)), jnp.float32)
    g_ent = jnp.asarray(rng.normal(size=(3, 5)), jnp.float32)

    def whole(h, w):
        logits = jnp.dot(h, w.T if tied else w, preferred_element_type=jnp.float32)
        return token_logprobs(logits, tokens, temperature)

    def chunked(h, w):
        return chunked_token_logprobs(h, w, axis, tokens, temperature, chunk)

    # The unchunked reference is the model's own head.
    np.testing.assert_allclose(np.asarray(whole(hidden, weights)[0]),
                               np.asarray(token_logprobs(model.logits(hidden), tokens, temperature)[0]), atol=1e-6)
    got, want = jax.jit(chunked)(hidden, weights), whole(hidden, weights)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=2e-5)
    assert np.all(np.asarray(got[1]) > 0)

    def loss(fn):
        return lambda h, w: jnp.sum(fn(h, w)[0] * g_logp + fn(h, w)[1] * g_ent)

    got = jax.jit(jax.grad(loss(chunked), argnums=(0, 1)))(hidden, weights)
    want = jax.grad(loss(whole), argnums=(0, 1))(hidden, weights)
    for g, w in zip(got, want):
        assert float(jnp.max(jnp.abs(w))) > 1e-2  # a real gradient, not zeros on both sides
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("tied", [True, False])
def test_policy_logprobs_with_a_chunked_head_match_and_differentiate_alike(tied):
    """Through the whole model: the response log-probs and the gradient of every parameter."""
    graphdef, params = nnx.split(random_model(tiny_config(tie_word_embeddings=tied)))
    batch = _batch()

    def loss(p, chunk):
        logp, ent = policy_logprobs(nnx.merge(graphdef, p), batch, 0.8, logits_chunk=chunk)
        return jnp.sum(logp * batch["response_mask"]) + 0.1 * jnp.sum(ent * batch["response_mask"]), (logp, ent)

    (l_whole, (lp_whole, ent_whole)), g_whole = jax.jit(jax.value_and_grad(lambda p: loss(p, 0), has_aux=True))(params)
    (l_chunk, (lp_chunk, ent_chunk)), g_chunk = jax.jit(jax.value_and_grad(lambda p: loss(p, 10), has_aux=True))(params)
    np.testing.assert_allclose(np.asarray(lp_chunk), np.asarray(lp_whole), rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(ent_chunk), np.asarray(ent_whole), rtol=1e-5, atol=2e-5)
    assert float(l_chunk) == pytest.approx(float(l_whole), rel=1e-5)
    for a, b in zip(jax.tree.leaves(g_chunk), jax.tree.leaves(g_whole)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=2e-5)


def test_a_chunked_head_needs_a_fraction_of_the_memory():
    """The compiled value-and-gradient of the log-probs of 8 x 256 tokens over a 32k
    vocabulary: XLA's temporaries chunked (4096 columns) against whole. Whole, the float32
    logits [2048, 32768] (256 MiB) and their gradient live several times over; chunked, one
    chunk's [2048, 4096] at a time and the head's gradient."""
    B, N, E, V = 8, 256, 256, 32768
    args = (jax.ShapeDtypeStruct((B, N, E), jnp.float32), jax.ShapeDtypeStruct((V, E), jnp.float32),
            jax.ShapeDtypeStruct((B, N), jnp.int32))

    def temp_bytes(fn):
        def loss(h, w, tokens):
            logp, entropy = fn(h, w, tokens)
            return jnp.sum(logp) + 0.1 * jnp.sum(entropy)

        compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(*args).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    whole = temp_bytes(lambda h, w, t: token_logprobs(jnp.dot(h, w.T, preferred_element_type=jnp.float32), t, 0.7))
    chunked = temp_bytes(lambda h, w, t: chunked_token_logprobs(h, w, 0, t, 0.7, 4096))
    logits_bytes = B * N * V * 4
    assert whole >= 2 * logits_bytes  # the whole path does hold the logits (and more)
    assert whole / chunked > 6, (whole, chunked)


@pytest.mark.parametrize("overrides, message", [
    (["actor.model.logits_chunk=-1"], "logits_chunk=-1 must be >= 0"),
    (["actor.model.logits_chunk=4096", "actor.model.matmul=mkl"], "matmul=mkl computes the log-probs"),
])
def test_bad_logits_chunk_is_one_line(overrides, message):
    with pytest.raises(BadInput, match=message):
        sft_config.check_memory_remedies(load_config("sft_math", overrides).actor.model)


@pytest.mark.slow
def test_sft_and_reasoning_updates_take_the_chunked_head(tmp_path):
    """``actor.model.logits_chunk`` reaches the sft step and the reasoning update (old
    log-probs, loss, reference): the same losses and parameters as without it."""
    from tests.test_reasoning import _fixed_batch, trainer
    from tests.test_sft import _trainer
    from rlinf_jax.tasks.reasoning import update as rl
    from rlinf_jax.tasks.sft.lm import train_step

    whole, chunked = _trainer(tmp_path), _trainer(tmp_path, "actor.model.logits_chunk=7")
    assert chunked.step_spec.logits_chunk == 7
    batch = jax.device_get(whole.next_batch())
    a, ma = train_step(whole.step_spec, whole.init(), batch)
    b, mb = train_step(chunked.step_spec, chunked.init(), batch)
    assert float(mb["train/loss"]) == pytest.approx(float(ma["train/loss"]), rel=1e-5)
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-6)

    extra = ("algorithm.update_epochs=2", "algorithm.lm.kl_coef=0.01")
    t_whole, t_chunked = trainer(tmp_path, *extra), trainer(tmp_path, *extra, "actor.model.logits_chunk=7")
    assert t_chunked.update_spec.logits_chunk == 7
    rl_batch = {k: jnp.asarray(v) for k, v in _fixed_batch(t_whole).items()}
    ref = t_whole._ref_logprobs(t_whole.reference, rl_batch)
    np.testing.assert_allclose(np.asarray(t_chunked._ref_logprobs(t_chunked.reference, rl_batch)), np.asarray(ref),
                               rtol=1e-5, atol=2e-5)
    rl_batch["ref_logp"] = ref
    a, ma = rl.update(t_whole.update_spec, t_whole.init(), rl_batch, jax.random.PRNGKey(3))
    b, mb = rl.update(t_chunked.update_spec, t_chunked.init(), rl_batch, jax.random.PRNGKey(3))
    for k in ("train/policy_loss", "train/entropy", "train/kl", "train/approx_kl"):
        assert float(mb[k]) == pytest.approx(float(ma[k]), rel=1e-4, abs=1e-6), k
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-6)
