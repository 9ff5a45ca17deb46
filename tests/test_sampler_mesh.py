"""The sampler on a rollout mesh samples what it samples on one device.

Runs on 8 fake CPU devices (the `devices` marker). The reference is the same sampler on a
single device: every row draws from its own key (folded from its sample id), so splitting
rows over ``data`` and heads, MLP and vocabulary over ``tensor`` must not change a token;
log-probs may differ by float rounding only.
"""

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from rlinf_jax.policies.lm.config import LMConfig
from rlinf_jax.policies.lm.model import CausalLM
from rlinf_jax.policies.lm.tiny import TINY_CONFIGS
from rlinf_jax.rollout import sampler as sampler_lib
from rlinf_jax.rollout.sampler import Sampler, SamplingParams
from rlinf_jax.sharding.placement import component_mesh, resolve_placement


@pytest.mark.slow
@pytest.mark.devices(8)
def test_sharded_sampling_equals_single_device(monkeypatch):
    assert len(jax.devices()) == 8
    # Qwen2 (q/k/v biases, tied embeddings) with a vocabulary of 96 so that it splits over tensor.
    config = LMConfig.from_hf_config({"model_type": "qwen2", **TINY_CONFIGS["qwen2"], "vocab_size": 96})
    graphdef, state = nnx.split(CausalLM(config, rngs=nnx.Rngs(0)))
    # Spread-out logits (init's N(0, 0.02) gives near-uniform ones, full of near ties).
    noise = iter(jax.random.split(jax.random.key(1), len(jax.tree.leaves(state))))
    state = jax.tree_util.tree_map_with_path(
        lambda path, x: jax.random.normal(next(noise), x.shape) * 0.25 + ("norm" in jax.tree_util.keystr(path)), state
    )
    model = nnx.merge(graphdef, state)

    B, L = 8, 11
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 96, (B, L))
    mask = np.ones((B, L), np.int64)
    for row, pad in enumerate([0, 3, 5, 1, 7, 0, 2, 9]):
        ids[row, :pad], mask[row, :pad] = 0, 0
    sample_ids = np.arange(100, 100 + B)
    key = jax.random.key(4)

    seen = {}
    decode = sampler_lib.decode_tokens

    def spy(graphdef, params, state, *args, **kwargs):
        seen["cache"], seen["tokens"] = state.cache.keys[0].sharding, state.tokens.sharding
        return decode(graphdef, params, state, *args, **kwargs)

    monkeypatch.setattr(sampler_lib, "decode_tokens", spy)

    def run(sampler, stop):
        greedy = SamplingParams(max_new_tokens=12, temperature=0, stop_tokens=stop)
        sampled = SamplingParams(max_new_tokens=12, temperature=0.9, top_k=30, top_p=0.95)
        return [jax.device_get(sampler.generate(ids, mask, key, p, sample_ids=sample_ids)) for p in (greedy, sampled)]

    single = Sampler(model)
    free = jax.device_get(single.generate(ids, mask, key, SamplingParams(max_new_tokens=12, temperature=0), sample_ids))
    stop = (int(free.tokens[0, 4]),)  # row 0 stops after 5 tokens, others maybe later or never
    want = run(single, stop)
    assert int(want[0].lengths[0]) == 5 and (want[0].lengths > 5).any(), want[0].lengths
    assert len(set(want[1].tokens.ravel().tolist())) > 10  # it does sample

    expected = {  # mesh -> (rows, KV cache, q_proj kernel, embedding) specs
        "data2_tensor2": ({"data": 2, "tensor": 2}, P("data"), P("data", "tensor"), P(None, "tensor"), P("tensor")),
        "data4": ({"data": 4}, P("data"), P("data"), P(), P()),
    }
    for name, (shape, rows, cache, q_kernel, embedding) in expected.items():
        placement = resolve_placement({"rollout": "4-7"}, ("rollout",), 8, {"rollout": shape})
        mesh = component_mesh(placement, "rollout")
        sampler = Sampler(model, mesh=mesh)
        params = sampler.params
        assert params["layers"][0]["attn"]["q_proj"]["kernel"][...].sharding.spec == q_kernel, name
        assert params["embed"]["embedding"][...].sharding.spec == embedding, name
        got = run(sampler, stop)
        assert seen["cache"].spec == cache and seen["cache"].mesh == mesh, (name, seen["cache"])
        assert seen["tokens"].spec == rows, (name, seen["tokens"])
        for mode, a, b in zip(("greedy", "sampled"), want, got):
            np.testing.assert_array_equal(b.tokens, a.tokens, err_msg=f"{name} {mode}")
            np.testing.assert_array_equal(b.mask, a.mask, err_msg=f"{name} {mode}")
            np.testing.assert_array_equal(b.lengths, a.lengths, err_msg=f"{name} {mode}")
            np.testing.assert_allclose(b.logprobs, a.logprobs, rtol=1e-5, atol=1e-5, err_msg=f"{name} {mode}")
        # New weights (here: unsharded ones) are moved onto the sampler's layout.
        sampler.set_params(state)
        assert sampler.params["layers"][0]["attn"]["q_proj"]["kernel"][...].sharding.spec == q_kernel, name
        assert sampler.params["layers"][0]["attn"]["q_proj"]["kernel"][...].sharding.mesh == mesh, name

    # A batch the data axis does not divide stays whole and still samples the same.
    odd = Sampler(model, mesh=mesh).generate(ids[:3], mask[:3], key, SamplingParams(max_new_tokens=12, temperature=0),
                                             sample_ids=sample_ids[:3])
    assert seen["tokens"].spec == P() and seen["cache"].spec == P(), seen
    np.testing.assert_array_equal(np.asarray(odd.tokens), free.tokens[:3])
