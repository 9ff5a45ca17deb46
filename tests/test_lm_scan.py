"""The scanned layer stack (``CausalLM(scan_layers=True)``) against the unrolled one: the same
weights give the same logits, hidden states, cached prefill and decode, log-probs, values and
gradients under every remat policy; the layouts convert into each other exactly; stacked
parameters keep their layer axis whole on a mesh; LoRA adapters of a stacked kernel are the
unrolled ones stacked."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, PartitionSpec

from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm import CausalLM, LMConfig, RopeConfig
from rlinf_jax.policies.lm.layout import stack_flat, unstack_flat
from rlinf_jax.policies.lm.logprobs import policy_logprobs, values_of
from rlinf_jax.policies.lm.lora import LoRA
from rlinf_jax.policies.lm.model import REMAT_POLICIES, relayout
from rlinf_jax.policies.lm.value import ValueModel
from rlinf_jax.rollout import sampler as sampler_lib
from rlinf_jax.runtime import Checkpointer, read_metrics
from rlinf_jax.rollout.sampler import Sampler, SamplingParams
from rlinf_jax.sharding import param_shardings
from rlinf_jax.sharding.partition import rules_from_config
from rlinf_jax.sharding.placement import component_mesh, resolve_placement
from rlinf_jax.tasks.registry import load_run_config
from rlinf_jax.tasks.sft.lm_model import load_checkpoint_policy
from rlinf_jax.cli.train import main

# float32 throughout. The two layouts run the same operations, but XLA fuses a loop body and
# an unrolled program differently, and a scanned last layer runs every column (where the
# unrolled one runs only the columns read), so sums may round differently in the last bits.
TOL = {"rtol": 2e-5, "atol": 2e-6}
REMATS = list(REMAT_POLICIES)


def tiny_config(**kw):
    base = {
        "model_type": "qwen3", "vocab_size": 53, "hidden_size": 40, "intermediate_size": 56, "num_layers": 3,
        "num_heads": 6, "num_kv_heads": 2, "head_dim": 12, "qk_norm": True, "attention_bias": True,
        "rope": RopeConfig(theta=1000.0),
    }
    return LMConfig(**{**base, **kw})


def random_model(config, seed=0, **kw):
    """An unrolled model with every parameter (norms and biases too) randomised."""
    model = CausalLM(config, rngs=nnx.Rngs(seed), **kw)
    state = nnx.state(model, nnx.Param)
    keys = iter(jax.random.split(jax.random.key(seed + 1), len(jax.tree.leaves(state))))
    nnx.update(model, jax.tree.map(lambda x: x + 0.1 * jax.random.normal(next(keys), x.shape, x.dtype), state))
    return model


def both_layouts(remat="none", **config):
    unrolled = random_model(tiny_config(**config), remat=remat)
    scanned = relayout(unrolled, scan_layers=True)
    assert scanned.scan_layers and not unrolled.scan_layers and scanned.remat == remat
    return unrolled, scanned


def flat(tree) -> dict[str, np.ndarray]:
    return {".".join(map(str, p)): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(tree)}


def unrolled_flat(state) -> dict[str, np.ndarray]:
    """A state of either layout as unrolled flat arrays (so gradients can be compared)."""
    return unstack_flat(flat(state))


def assert_same_tree(a: dict, b: dict, **tol):
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], err_msg=k, **(tol or TOL))


def padded_batch(seed=0, B=4, P=6, N=5, vocab=53):
    rng = np.random.default_rng(seed)
    prompt_mask = np.ones((B, P), np.int32)
    prompt_mask[1, :2] = 0
    prompt_mask[3, :4] = 0
    response_mask = np.ones((B, N), np.int32)
    response_mask[2, 3:] = 0
    return {
        "prompt_ids": jnp.asarray(rng.integers(0, vocab, (B, P)), jnp.int32),
        "prompt_mask": jnp.asarray(prompt_mask),
        "tokens": jnp.asarray(rng.integers(0, vocab, (B, N)), jnp.int32),
        "response_mask": jnp.asarray(response_mask),
    }


def test_a_seed_gives_the_same_weights_in_both_layouts_and_they_convert_exactly():
    config = tiny_config()
    unrolled = CausalLM(config, rngs=nnx.Rngs(3))
    scanned = CausalLM(config, rngs=nnx.Rngs(3), scan_layers=True)
    kernel = scanned.layers.mlp.up_proj.kernel
    assert kernel[...].shape == (3, 40, 56)
    assert kernel.get_metadata()["out_sharding"] == ("layers", "embed", "mlp")
    assert_same_tree(unrolled_flat(nnx.state(scanned)), flat(nnx.state(unrolled)), rtol=0, atol=0)
    back = relayout(relayout(unrolled, True), False)
    assert_same_tree(flat(nnx.state(back)), flat(nnx.state(unrolled)), rtol=0, atol=0)
    assert relayout(scanned, True) is scanned
    stacked = stack_flat(flat(nnx.state(unrolled)), 3)
    assert stacked["layers.attn.q_proj.kernel"].shape == (3, 40, 72) and "layers.0.attn.q_proj.kernel" not in stacked


@pytest.mark.parametrize("remat", REMATS)
def test_logits_hidden_states_and_cached_decode_agree(remat):
    unrolled, scanned = both_layouts(remat)
    B, P, S = 3, 5, 11
    rng = np.random.default_rng(1)
    ids = jnp.asarray(rng.integers(0, 53, (B, S)), jnp.int32)
    mask = np.ones((B, S), bool)
    mask[1, :3] = False
    mask = jnp.asarray(mask)

    forward = jax.jit(lambda m: m(ids, mask))
    np.testing.assert_allclose(forward(scanned), forward(unrolled), **TOL)
    cols = jax.jit(lambda m: m.hidden_states(ids, mask, output_cols=(4, 6)))
    assert cols(scanned).shape == (B, 6, 40)
    np.testing.assert_allclose(cols(scanned), cols(unrolled), **TOL)

    def prefill_and_decode(m):
        cache = m.init_cache(B, S)
        last, cache = m.hidden_states(ids[:, :P], mask, cache=cache, cache_index=0, output_cols=(P - 1, 1))
        steps = [m.logits(last)]
        for t in range(P, S):
            logits, cache = m(ids[:, t : t + 1], mask, cache=cache, cache_index=t)
            steps.append(logits)
        return jnp.concatenate(steps, axis=1), cache

    got, cache = jax.jit(prefill_and_decode)(scanned)
    want, want_cache = jax.jit(prefill_and_decode)(unrolled)
    assert cache.stacked and cache.keys.shape == (3, B, 2, 12, S)
    np.testing.assert_allclose(got, want, **TOL)
    np.testing.assert_allclose(got, forward(unrolled)[:, P - 1 :], **TOL)  # the cache path is the full pass
    for layer in range(3):
        np.testing.assert_allclose(cache.keys[layer], want_cache.keys[layer], **TOL)
        np.testing.assert_allclose(cache.values[layer], want_cache.values[layer], **TOL)


@pytest.mark.parametrize("remat", REMATS)
@pytest.mark.parametrize("group", [1, 2])
def test_logprobs_and_their_gradients_agree(remat, group):
    """``group=2`` runs the shared-prompt path: a cached prefill, its rows repeated
    (``KVCache.map_rows`` on a stacked cache), the responses on top."""
    unrolled, scanned = both_layouts(remat, tie_word_embeddings=True)
    batch = padded_batch()
    if group == 2:
        batch = {**batch, "prompt_ids": jnp.repeat(batch["prompt_ids"][::2], 2, axis=0),
                 "prompt_mask": jnp.repeat(batch["prompt_mask"][::2], 2, axis=0)}

    def loss(params, graphdef):
        logp, entropy = policy_logprobs(nnx.merge(graphdef, params), batch, temperature=0.7, group=group)
        return jnp.sum(logp * batch["response_mask"]) + 0.1 * jnp.sum(entropy), (logp, entropy)

    out = {}
    for name, model in (("unrolled", unrolled), ("scanned", scanned)):
        graphdef, params = nnx.split(model)
        (value, aux), grads = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)(params, graphdef)
        out[name] = (value, aux, unrolled_flat(grads))
    np.testing.assert_allclose(out["scanned"][0], out["unrolled"][0], **TOL)
    for got, want in zip(out["scanned"][1], out["unrolled"][1], strict=True):
        np.testing.assert_allclose(got, want, **TOL)
    assert_same_tree(out["scanned"][2], out["unrolled"][2], rtol=1e-4, atol=1e-5)
    assert np.abs(out["unrolled"][2]["layers.0.mlp.gate_proj.kernel"]).max() > 1e-3  # gradients reach the stack


def test_remat_policies_give_the_unrolled_gradients_of_no_remat():
    """Rematerialisation changes what is stored, not what is computed."""
    plain, _ = both_layouts("none")
    batch = padded_batch(seed=2)

    def grads_of(model):
        graphdef, params = nnx.split(model)
        f = lambda p: jnp.sum(policy_logprobs(nnx.merge(graphdef, p), batch)[0])  # noqa: E731
        return unrolled_flat(jax.jit(jax.grad(f))(params))

    want = grads_of(plain)
    for remat in ("full", "dots"):
        for scan in (False, True):
            model = relayout(plain, scan)
            model.remat = remat
            assert_same_tree(grads_of(model), want, rtol=1e-4, atol=1e-5)


def test_value_model_on_a_scanned_trunk():
    unrolled, scanned = both_layouts("dots")
    batch = padded_batch(seed=3)
    values = {}
    for name, trunk in (("unrolled", unrolled), ("scanned", scanned)):
        vm = ValueModel(trunk, rngs=nnx.Rngs(0))
        vm.head.kernel[...] = jnp.linspace(-1, 1, 40)[:, None]
        values[name] = jax.jit(lambda m: values_of(m, batch))(vm)
    assert values["scanned"].shape == (4, 5)
    np.testing.assert_allclose(values["scanned"], values["unrolled"], **TOL)


@pytest.mark.slow
@pytest.mark.devices(4)
def test_stacked_parameters_keep_the_layer_axis_whole_on_a_mesh():
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("fsdp", "tensor"))
    _, scanned = both_layouts(hidden_size=48, intermediate_size=64, num_heads=4, head_dim=12, num_kv_heads=2,
                              qk_norm=False)
    graphdef, state = nnx.split(scanned)
    shardings = nnx.to_flat_state(param_shardings(state, mesh))
    specs = {".".join(map(str, p)): v.get_value().spec for p, v in shardings}
    assert specs["layers.mlp.up_proj.kernel"] == PartitionSpec(None, "fsdp", "tensor")
    assert specs["layers.attn.o_proj.kernel"] == PartitionSpec(None, "tensor", "fsdp")
    assert specs["layers.attn.q_proj.bias"] == PartitionSpec(None, "tensor")
    assert all(spec == PartitionSpec() or spec[0] is None for k, spec in specs.items() if k.startswith("layers."))


def test_partition_rules_refuse_to_shard_the_layer_axis():
    with pytest.raises(BadInput, match="layers"):
        rules_from_config({"layers": "fsdp"})
    assert rules_from_config({"layers": None})["layers"] is None


def test_lora_on_stacked_kernels_is_the_unrolled_lora_stacked():
    unrolled, scanned = both_layouts()
    lora_u = LoRA(nnx.state(unrolled), rank=4, alpha=8.0)
    lora_s = LoRA(nnx.state(scanned), rank=4, alpha=8.0)
    assert len(lora_u.targets) == 21 and len(lora_s.targets) == 7
    ad_u, ad_s = lora_u.init(jax.random.key(5)), lora_s.init(jax.random.key(5))
    assert ad_s["layers:mlp:down_proj:kernel"]["a"].shape == (3, 56, 4)
    for key, pair in ad_s.items():
        name = key.split(":", 1)[1]
        for part in ("a", "b"):
            want = np.stack([ad_u[f"layers:{i}:{name}"][part] for i in range(3)])
            np.testing.assert_array_equal(pair[part], want, err_msg=f"{key}.{part}")
    # A trained B: the merged weights agree layer by layer.
    ad_u = jax.tree.map(lambda x: x + 0.05, ad_u)
    ad_s = jax.tree.map(lambda x: x + 0.05, ad_s)
    merged_u = flat(lora_u.merge(nnx.state(unrolled), ad_u))
    merged_s = unrolled_flat(lora_s.merge(nnx.state(scanned), ad_s))
    assert_same_tree(merged_s, merged_u, rtol=1e-6, atol=1e-6)


def test_bad_remat_name_is_bad_input():
    with pytest.raises(BadInput, match="remat='some'.*none, full, dots"):
        CausalLM(tiny_config(), rngs=nnx.Rngs(0), remat="some")
    with pytest.raises(BadInput, match=r"^actor\.model\.remat='some' is not a rematerialisation policy"):
        load_run_config("sft_math", ["actor.model.remat=some"])
    # The keys are an LM run's: an embodied run refuses them.
    with pytest.raises(BadInput, match="actor.model.scan_layers"):
        load_run_config("ppo_brax", ["actor.model.scan_layers=true"])
    cfg = load_run_config("grpo_math", ["actor.model.scan_layers=true", "actor.model.remat=dots"])
    assert cfg.actor.model.scan_layers and cfg.actor.model.remat == "dots"


@pytest.mark.parametrize("group", [1, 2])
def test_sampler_generates_the_same_tokens_from_a_scanned_model(group):
    """(The models carry a remat policy, which the sampler drops: it never differentiates.)"""
    unrolled, scanned = both_layouts("full", tie_word_embeddings=True)
    sampler = Sampler(scanned)
    assert nnx.merge(sampler.graphdef, sampler.params).remat == "none" and scanned.remat == "full"
    rng = np.random.default_rng(4)
    prompts = rng.integers(1, 53, (2, 7))
    mask = np.ones((2, 7), np.int32)
    mask[1, :3] = 0
    prompts, mask = np.repeat(prompts, 2, axis=0), np.repeat(mask, 2, axis=0)  # group=2 prefills each once
    params = SamplingParams(max_new_tokens=6, temperature=0.8)
    out = {name: Sampler(m).generate(prompts, mask, jax.random.key(1), params, group=group)
           for name, m in (("unrolled", unrolled), ("scanned", scanned))}
    np.testing.assert_array_equal(out["scanned"].tokens, out["unrolled"].tokens)
    np.testing.assert_allclose(out["scanned"].logprobs, out["unrolled"].logprobs, **TOL)
    assert out["scanned"].tokens.shape == (4, 6)


def test_a_stacked_cache_extends_and_maps_rows_like_per_layer_ones():
    _, scanned = both_layouts()
    cache = scanned.init_cache(2, 5)
    cache = cache._replace(keys=cache.keys + jnp.arange(5.0), values=cache.values + 1.0)
    longer = cache.extend(3)
    assert longer.keys.shape == (3, 2, 2, 12, 8) and longer.values.shape == (3, 2, 2, 8, 12)
    assert longer.max_len == 8 and float(longer.keys[:, :, :, :, 5:].sum()) == 0.0
    np.testing.assert_array_equal(longer.keys[..., :5], cache.keys)
    repeated = cache.map_rows(lambda x: jnp.repeat(x, 3, axis=0))
    assert repeated.keys.shape == (3, 6, 2, 12, 5)
    np.testing.assert_array_equal(repeated.keys[1, 2], cache.keys[1, 0])


@pytest.mark.slow
@pytest.mark.devices(4)
def test_a_scanned_sampler_on_a_mesh_samples_what_the_unrolled_one_does(monkeypatch):
    """The stacked cache is pinned per layer (``Layout.pin_cache`` maps over the layer axis):
    rows over ``data``, KV heads over ``tensor``, the layer axis whole."""
    unrolled, scanned = both_layouts(tie_word_embeddings=True, vocab_size=56)
    placement = resolve_placement({"rollout": "0-3"}, ("rollout",), 4, {"rollout": {"data": 2, "tensor": 2}})
    mesh = component_mesh(placement, "rollout")
    seen = {}
    decode = sampler_lib.decode_tokens

    def spy(graphdef, params, state, *args, **kwargs):
        if state.cache.stacked:
            seen["cache"] = state.cache.keys.sharding
        return decode(graphdef, params, state, *args, **kwargs)

    monkeypatch.setattr(sampler_lib, "decode_tokens", spy)
    rng = np.random.default_rng(6)
    prompts = rng.integers(1, 56, (4, 6))
    mask = np.ones((4, 6), np.int32)
    mask[2, :4] = 0
    params = SamplingParams(max_new_tokens=5, temperature=0.9)
    want = Sampler(unrolled).generate(prompts, mask, jax.random.key(2), params)
    got = Sampler(scanned, mesh=mesh).generate(prompts, mask, jax.random.key(2), params)
    assert seen["cache"].spec == PartitionSpec(None, "data", "tensor")
    np.testing.assert_array_equal(jax.device_get(got.tokens), jax.device_get(want.tokens))
    np.testing.assert_allclose(jax.device_get(got.logprobs), jax.device_get(want.logprobs), rtol=1e-4, atol=1e-5)


SFT = ["--config-name", "sft_math", "actor.model.lm.hidden_size=32", "actor.model.lm.intermediate_size=64",
       "actor.model.lm.num_layers=2", "actor.model.lm.num_heads=2", "actor.model.lm.num_kv_heads=1",
       "actor.model.lora_rank=4", "actor.model.lora_alpha=8", "actor.global_batch_size=8",
       "actor.micro_batch_size=4", "actor.optim.warmup_steps=0", "actor.optim.lr=3e-3", "data.eval_size=8",
       "rollout.max_new_tokens=12", "rollout.eval_batch_size=8", "runner.max_steps=2", "runner.save_interval=2",
       "runner.eval_interval=0", "runner.log_interval=1", "runner.progress_bar=false", "runner.tensorboard=false"]


def test_an_sft_run_trains_alike_in_both_layouts_and_resumes_only_in_its_own(tmp_path, capsys):
    """A LoRA SFT run trains the same numbers scanned (with remat) as unrolled; its checkpoint
    records the layout, a resume in the other one is refused in one line, and the checkpoint
    loads as ``actor.model.path`` into either layout with the adapters merged."""
    out = [f"runner.output_dir={tmp_path}"]
    assert main([*SFT, *out, "runner.experiment_name=u"]) == 0
    assert main([*SFT, *out, "runner.experiment_name=s", "actor.model.scan_layers=true", "actor.model.remat=dots"]) == 0
    unrolled_log, scanned_log = read_metrics(tmp_path / "u"), read_metrics(tmp_path / "s")
    losses = [[r["train/loss"] for r in log if "train/loss" in r] for log in (unrolled_log, scanned_log)]
    assert len(losses[0]) == 2
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
    _, meta = Checkpointer(tmp_path / "s" / "checkpoints").restore(2, None)
    assert meta["lm_scan_layers"] is True
    capsys.readouterr()

    assert main([*SFT, *out, "runner.experiment_name=s", "runner.max_steps=4", "runner.resume=auto"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "actor.model.scan_layers=true" in err[0], err

    want = flat(nnx.state(load_checkpoint_policy(tmp_path / "u")[0]))  # adapters merged
    for scan in (False, True, None):
        model, _ = load_checkpoint_policy(tmp_path / "s", scan_layers=scan)
        assert model.scan_layers is (scan is not False)  # None: the layout the run trained in
        assert_same_tree(unrolled_flat(nnx.state(model)), want, rtol=1e-5, atol=1e-6)
