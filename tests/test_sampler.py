"""The KV-cache sampler against transformers' generate, a full-recompute forward pass, and
hand-computed sampling distributions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm import from_pretrained
from rlinf_jax.policies.lm.tiny import save_tiny
from rlinf_jax.rollout import sampler as sampler_lib
from rlinf_jax.rollout.sampler import Sampler, SamplingParams, bucket_length

torch.set_num_threads(1)
VOCAB = 97


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def family(request, tmp_path_factory):
    path, hf = save_tiny(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, from_pretrained(path), hf


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    path, hf = save_tiny("qwen3", tmp_path_factory.mktemp("qwen3s"))
    return from_pretrained(path), hf


def left_padded(seed, batch, length, pads):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, (batch, length))
    mask = np.ones((batch, length), np.int64)
    for row, n in enumerate(pads):
        ids[row, :n] = 0
        mask[row, :n] = 0
    return ids, mask


def hf_generate(hf, ids, mask, new_tokens, eos=None):
    hf.generation_config.eos_token_id = eos
    try:
        with torch.no_grad():
            out = hf.generate(
                input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), do_sample=False,
                max_new_tokens=new_tokens, pad_token_id=0,
            )
    finally:
        hf.generation_config.eos_token_id = None
    return out[:, ids.shape[1] :].numpy()


def test_greedy_matches_transformers_generate(family):
    name, model, hf = family
    ids, mask = left_padded(seed=5, batch=4, length=9, pads=(0, 3, 8, 1))
    out = Sampler(model).generate(ids, mask, jax.random.key(0), SamplingParams(max_new_tokens=32, temperature=0))
    ref = hf_generate(hf, ids, mask, 32)
    np.testing.assert_array_equal(np.asarray(out.tokens), ref, err_msg=name)
    assert bool(out.mask.all()) and out.lengths.tolist() == [32] * 4
    # Greedy log-probs are the untempered model's: check one row by a direct forward pass.
    full = np.concatenate([ids[:1], ref[:1]], axis=1)
    logits = np.asarray(model(jnp.asarray(full), jnp.asarray(np.concatenate([mask[:1], np.ones((1, 32))], 1))))
    logp = jax.nn.log_softmax(logits[0, ids.shape[1] - 1 : -1], axis=-1)
    np.testing.assert_allclose(out.logprobs[0], np.take_along_axis(np.asarray(logp), ref[0][:, None], 1)[:, 0], atol=1e-4)


def test_greedy_stop_token_matches_generate(qwen3):
    model, hf = qwen3
    ids, mask = left_padded(seed=6, batch=4, length=6, pads=(2, 0, 4, 1))
    free = hf_generate(hf, ids, mask, 24)
    stop = int(free[0, 5])  # row 0 reaches it at step 5; other rows maybe later or never
    ref = hf_generate(hf, ids, mask, 24, eos=stop)
    out = Sampler(model).generate(
        ids, mask, jax.random.key(0), SamplingParams(max_new_tokens=24, temperature=0, stop_tokens=(stop,))
    )
    tokens, m = np.asarray(out.tokens), np.asarray(out.mask)
    n = ref.shape[1]  # generate stops once every row has finished
    np.testing.assert_array_equal(tokens[:, :n], ref)  # pads (0) after the stop token on both sides
    for row in range(4):
        hits = np.flatnonzero(free[row] == stop)
        length = hits[0] + 1 if hits.size else 24
        assert m[row].tolist() == [True] * length + [False] * (24 - length)
        assert int(out.lengths[row]) == length
        assert (tokens[row, length:] == 0).all() and (np.asarray(out.logprobs)[row, length:] == 0).all()
    assert int(out.lengths[0]) == 6


def test_sampled_logprobs_match_a_full_forward_pass(qwen3):
    model, _ = qwen3
    ids, mask = left_padded(seed=7, batch=5, length=7, pads=(0, 2, 6, 3, 1))
    params = SamplingParams(max_new_tokens=20, temperature=0.7, top_k=20, top_p=0.9)
    out = Sampler(model).generate(ids, mask, jax.random.key(3), params)
    tokens = np.asarray(out.tokens)
    full = np.concatenate([ids, tokens], axis=1)
    full_mask = np.concatenate([mask, np.ones_like(tokens)], axis=1)
    logits = np.asarray(model(jnp.asarray(full), jnp.asarray(full_mask)))[:, ids.shape[1] - 1 : -1] / 0.7
    logp = np.asarray(jax.nn.log_softmax(jnp.asarray(logits), axis=-1))
    want = np.take_along_axis(logp, tokens[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(out.logprobs), want, atol=1e-4)
    # Every token lies in its step's top-20 and in the 0.9 nucleus of the tempered distribution.
    rank = (logp > want[..., None]).sum(-1)
    assert rank.max() < 20
    probs = np.exp(logp)
    mass_before = np.where(logp > want[..., None], probs, 0).sum(-1)
    assert mass_before.max() < 0.9
    assert len(set(tokens.ravel().tolist())) > 10  # it does sample


def test_rows_do_not_depend_on_how_the_batch_is_cut(qwen3):
    model, _ = qwen3
    ids, mask = left_padded(seed=8, batch=4, length=10, pads=(0, 4, 2, 7))
    params = SamplingParams(max_new_tokens=16, temperature=1.0)
    sampler = Sampler(model)
    whole = sampler.generate(ids, mask, jax.random.key(9), params, sample_ids=[10, 11, 12, 13])
    part = sampler.generate(ids[2:], mask[2:], jax.random.key(9), params, sample_ids=[12, 13])
    np.testing.assert_array_equal(np.asarray(whole.tokens[2:]), np.asarray(part.tokens))
    np.testing.assert_allclose(np.asarray(whole.logprobs[2:]), np.asarray(part.logprobs), atol=1e-5)
    other_key = sampler.generate(ids[2:], mask[2:], jax.random.key(10), params, sample_ids=[12, 13])
    assert (np.asarray(other_key.tokens) != np.asarray(part.tokens)).any()


def test_a_group_of_one_prompt_is_prefilled_once_and_samples_as_rows_alone(qwen3):
    model, _ = qwen3
    ids, mask = left_padded(seed=5, batch=3, length=10, pads=(0, 4, 2))
    ids, mask = np.repeat(ids, 4, axis=0), np.repeat(mask, 4, axis=0)  # 3 prompts x 4 samples
    params = SamplingParams(max_new_tokens=16, temperature=1.0)
    sampler = Sampler(model)
    grouped = sampler.generate(ids, mask, jax.random.key(2), params, group=4)
    per_row = sampler.generate(ids, mask, jax.random.key(2), params)
    np.testing.assert_array_equal(np.asarray(grouped.tokens), np.asarray(per_row.tokens))
    np.testing.assert_allclose(np.asarray(grouped.logprobs), np.asarray(per_row.logprobs), atol=1e-5)
    assert len(set(map(tuple, np.asarray(grouped.tokens).tolist()))) > 3  # the rows of a group differ
    for bad in (5, 3):  # does not divide the rows; rows 0-2 and 3-5 are not one prompt each
        with pytest.raises(BadInput, match="group"):
            sampler.generate(ids, mask, jax.random.key(2), params, group=bad)


def reference_distribution(logits, temperature, top_k, top_p):
    """Hand formula: temper, keep the top-k, then the smallest prefix with mass >= top_p."""
    z = logits / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-z, kind="stable")
    keep = np.zeros_like(p, bool)
    if top_k:
        keep[order[:top_k]] = True
    else:
        keep[:] = True
    q = np.where(keep, p, 0)
    q /= q.sum()
    mass = 0.0
    nucleus = np.zeros_like(keep)
    for i in order:
        if not keep[i] or mass >= top_p:
            continue
        nucleus[i] = True
        mass += q[i]
    out = np.where(nucleus, p, 0)
    return out / out.sum()


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(1.0, 0, 1.0), (0.5, 7, 1.0), (1.3, 0, 0.8), (0.8, 12, 0.7)])
def test_sampling_distribution_matches_hand_formula(temperature, top_k, top_p):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=150).astype(np.float32) * 2  # V=150: several blocks of 64, the last partial
    want = reference_distribution(logits.astype(np.float64), temperature, top_k, top_p)
    n = 40_000
    u = jax.random.uniform(jax.random.key(1), (n,))
    choose = jax.jit(
        lambda lg, u: sampler_lib.choose_token(
            lg, u, jnp.float32(temperature), jnp.float32(top_p), greedy=False, top_k=top_k, use_top_p=top_p < 1
        )
    )
    tokens, logp = choose(jnp.broadcast_to(jnp.asarray(logits), (n, 150)), u)
    counts = np.bincount(np.asarray(tokens), minlength=150)
    assert set(np.flatnonzero(counts)) <= set(np.flatnonzero(want))
    expected = want * n
    sigma = np.sqrt(expected * (1 - want)) + 1e-9
    assert np.max(np.abs(counts - expected) / sigma) < 5
    tempered = logits / temperature - np.log(np.exp(logits / temperature - (logits / temperature).max()).sum()) - (
        logits / temperature
    ).max()
    np.testing.assert_allclose(np.asarray(logp), tempered[np.asarray(tokens)], atol=1e-5)


def test_inverse_cdf_never_picks_zero_weight():
    weights = np.zeros((4, 200), np.float32)
    weights[0, 70] = 1.0  # a single entry in the second block
    weights[1, [0, 199]] = 1.0  # first and last entries
    weights[2, 130:140] = 1e-30  # tiny but positive
    weights[3, 64:128] = 1.0  # one whole block
    for u in (0.0, 0.5, 1 - 1e-7):
        picks = np.asarray(sampler_lib._inverse_cdf(jnp.asarray(weights), jnp.full((4,), u, jnp.float32)))
        assert all(weights[r, picks[r]] > 0 for r in range(4)), (u, picks)
    ends = [sampler_lib._inverse_cdf(jnp.asarray(weights[1:2]), jnp.full((1,), u)) for u in (0.0, 1 - 1e-7)]
    assert [int(e[0]) for e in ends] == [0, 199]


def test_compiles_once_per_bucket(qwen3):
    model, _ = qwen3
    sampler = Sampler(model)
    key = jax.random.key(0)
    # The programs' caches are the process's: another test in this worker may have compiled
    # a bucket this one counts on being new. Counted from empty, the order does not matter.
    sampler_lib.prefill_prompts.clear_cache()
    sampler_lib.decode_tokens.clear_cache()

    def run(width, new):
        ids, mask = left_padded(seed=width, batch=3, length=width, pads=(0, 1, 2))
        sampler.generate(ids, mask, key, SamplingParams(max_new_tokens=new, temperature=0.9, top_p=0.95))

    run(17, 10)
    before = (sampler_lib.prefill_prompts._cache_size(), sampler_lib.decode_tokens._cache_size())
    run(20, 14)  # prompt bucket 24, generation bucket 16: both as before
    run(24, 16)
    assert (sampler_lib.prefill_prompts._cache_size(), sampler_lib.decode_tokens._cache_size()) == before
    run(25, 16)  # next prompt bucket
    assert sampler_lib.prefill_prompts._cache_size() == before[0] + 1


def test_bucket_lengths():
    assert [bucket_length(n) for n in (1, 8, 9, 16, 17, 24, 25, 33, 64, 65, 100, 129, 300, 1000)] == [
        8, 8, 16, 16, 24, 24, 32, 40, 64, 80, 112, 160, 320, 1024,
    ]
    for n in range(1, 2000):
        b = bucket_length(n)
        assert n <= b and (b <= 8 or b < 1.25 * n + 8)


def test_bad_inputs(qwen3):
    model, _ = qwen3
    sampler = Sampler(model)
    ids = np.ones((2, 4), np.int64)
    right_padded = np.array([[1, 1, 1, 0], [1, 1, 1, 1]])
    with pytest.raises(BadInput, match="left-padded"):
        sampler.generate(ids, right_padded, jax.random.key(0), SamplingParams(max_new_tokens=4))
    with pytest.raises(BadInput, match="sample_ids"):
        sampler.generate(ids, np.ones_like(ids), jax.random.key(0), SamplingParams(max_new_tokens=4), sample_ids=[1])
    with pytest.raises(BadInput, match="top_k"):
        sampler.generate(ids, np.ones_like(ids), jax.random.key(0), SamplingParams(max_new_tokens=4, top_k=98))
    with pytest.raises(BadInput, match="top_p"):
        SamplingParams(max_new_tokens=4, top_p=0.0)
    with pytest.raises(BadInput, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0)
    with pytest.raises(BadInput, match="temperature"):
        SamplingParams(max_new_tokens=3, temperature=-1.0)
