"""QLoRA (``actor.model.base_qtype=nf4``): the frozen base stored in 4-bit NormalFloat through
qwix, within NF4's error of the dense weights, at about 1/7 of their float32 bytes, with
gradients reaching only the adapters; checkpoints of such a run load as a dense model."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rlinf_jax.config import load_config
from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm import CausalLM
from rlinf_jax.policies.lm.logprobs import policy_logprobs
from rlinf_jax.policies.lm.qlora import (
    CODES,
    MAX_ERROR,
    SCALE,
    QLoRA,
    dequantize_flat,
    dequantize_kernel,
    dequantize_state,
    quantize_kernel,
)
from rlinf_jax.tasks.sft import config as sft_config
from tests.test_lm_model import tiny_config

pytest.importorskip("qwix")

# Projections of 64 and 128 columns: NF4's blocks of 64 exactly, as in real models.
CONFIG = tiny_config(hidden_size=128, intermediate_size=256, num_heads=4, num_kv_heads=2, head_dim=32)


def _blocks_absmax(w: np.ndarray, block: int) -> np.ndarray:
    """Each element's block absolute maximum (blocks of ``block`` along the last axis)."""
    blocks = np.abs(w).reshape(*w.shape[:-1], w.shape[-1] // block, block)
    return np.repeat(blocks.max(-1), block, axis=-1)


@pytest.mark.parametrize("shape, block", [((64, 128), 64), ((3, 40, 96), 48), ((8, 24), 24)])
def test_nf4_kernels_are_within_the_absmax_error_of_their_block(shape, block):
    """Every element lands on one of the 16 NF4 levels times its block's absolute maximum,
    at most ``MAX_ERROR`` (half the widest gap between levels, -1 to -0.696) times that
    maximum away; kernels of any rank (a stacked layer axis first) keep blocks per row. A
    dequantised kernel quantises to itself (the levels are fixed points), which checks the
    packing of two codes a byte."""
    w = np.asarray(jax.random.normal(jax.random.PRNGKey(0), shape) * 0.02)
    codes, scale = quantize_kernel(jnp.asarray(w))
    assert codes.dtype == jnp.uint8 and codes.shape == (*shape[:-1], shape[-1] // 2)
    assert scale.shape == (*shape[:-1], shape[-1] // block)
    dense = np.asarray(dequantize_kernel(codes, scale))
    absmax = _blocks_absmax(w, block)
    err = np.abs(dense - w)
    assert np.all(err <= MAX_ERROR * absmax * (1 + 1e-6))
    assert 0.05 < np.sqrt((err**2).mean() / (w**2).mean()) < 0.15  # NF4 on Gaussian weights: about 1/11
    # Each block's largest element is exact (level +-1), and all 16 levels occur.
    np.testing.assert_allclose(np.max(np.abs(dense), axis=-1), np.max(np.abs(w), axis=-1), rtol=1e-6)
    assert len(np.unique(np.concatenate([np.asarray(codes) & 0xF, np.asarray(codes) >> 4]))) == 16
    again = dequantize_kernel(*quantize_kernel(jnp.asarray(dense)))
    np.testing.assert_allclose(np.asarray(again), dense, rtol=1e-6, atol=1e-9)


def test_an_odd_kernel_width_is_one_line():
    with pytest.raises(BadInput, match="packs two 4-bit codes a byte.*51 elements"):
        quantize_kernel(jnp.ones((4, 51)))


@pytest.mark.parametrize("dtype, ratio", [(jnp.float32, (0.5 + 4 / 64) / 4), (jnp.bfloat16, (0.5 + 2 / 64) / 2)])
def test_the_stored_kernels_take_a_seventh_of_their_float32_bytes(dtype, ratio):
    """The adapted kernels stored: half a byte a weight for the codes, one scale (in the
    kernel's dtype) per 64 weights; 0.140625 of their float32 bytes, 0.2656 of bfloat16.
    Embeddings, norms and biases stay as they were."""
    model = CausalLM(CONFIG, dtype=dtype, rngs=nnx.Rngs(0))
    _, state = nnx.split(model)
    qlora = QLoRA(state, 4, 8.0)
    stored = qlora.quantize(state)

    def nbytes(entries):
        return sum(v.get_value().nbytes for _, v in entries)

    dense = dict(nnx.to_flat_state(state))
    quantised = [(p, v) for p, v in nnx.to_flat_state(stored) if p[-1] in (CODES, SCALE)]
    adapted = [(p, dense[p]) for p in {p[:-1] for p, _ in quantised}]
    assert len(adapted) == 7 * CONFIG.num_layers
    assert nbytes(quantised) / nbytes(adapted) == pytest.approx(ratio)
    whole = nbytes(nnx.to_flat_state(stored)) / nbytes(nnx.to_flat_state(state))
    assert whole < 0.2 if dtype == jnp.float32 else whole < 0.35  # the embedding, head, norms and biases as they were
    assert {v.get_value().dtype for p, v in quantised if p[-1] == CODES} == {jnp.dtype(jnp.uint8)}
    assert {v.get_value().dtype for p, v in quantised if p[-1] == SCALE} == {jnp.dtype(dtype)}
    # The stored codes keep the kernel's logical axis names (the sharding rules read them).
    names = nnx.get_partition_spec(stored)["layers"][0]["mlp"]["up_proj"]["kernel"][CODES].get_value()
    assert tuple(names) == ("embed", "mlp")


def test_forward_pass_is_the_dense_model_within_nf4s_error():
    """Zero adapters over the NF4 base: exactly the dense model run on the dequantised
    kernels, so NF4's weight error is the only difference; each weight is within
    ``MAX_ERROR`` x its block's absmax (above). Through the model that error moves the
    logits by a relative RMS of about twice the weights' relative RMS error (0.09 for NF4 on
    N(0, 0.02) weights; 0.18 measured for this 2-layer model, as each of the 14 quantised
    kernels adds its own): asserted below 3x, and log-probs within 0.25 nats. A wrong
    packing or block axis moves the weights by about their own size, 10x beyond it."""
    model = CausalLM(CONFIG, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    qlora = QLoRA(state, 4, 8.0)
    stored = qlora.quantize(state)
    adapters = qlora.init(jax.random.PRNGKey(1))
    merged = qlora.merge(stored, adapters)
    ids = jax.random.randint(jax.random.PRNGKey(2), (2, 12), 0, CONFIG.vocab_size)
    dense_logits = np.asarray(model(ids))
    q_logits = np.asarray(nnx.merge(graphdef, merged)(ids))
    np.testing.assert_allclose(q_logits, np.asarray(nnx.merge(graphdef, dequantize_state(stored))(ids)), atol=1e-6)

    num = den = 0.0
    for (path, w), (_, w_q) in zip(nnx.to_flat_state(state), nnx.to_flat_state(merged)):
        w, w_q = np.asarray(w.get_value()), np.asarray(w_q.get_value())
        if path[-1] == "kernel" and path[-2].endswith("proj"):
            assert np.all(np.abs(w_q - w) <= MAX_ERROR * _blocks_absmax(w, 64) * (1 + 1e-6))
            num, den = num + ((w_q - w) ** 2).sum(), den + (w**2).sum()
        else:
            np.testing.assert_array_equal(w_q, w)  # embeddings, norms, biases: untouched
    weight_error = np.sqrt(num / den)
    assert 0.05 < weight_error < 0.15
    centred = dense_logits - dense_logits.mean(-1, keepdims=True)
    logit_error = np.sqrt(((q_logits - dense_logits) ** 2).sum() / (centred**2).sum())
    assert 0 < logit_error < 3 * weight_error
    logp, logp_q = jax.nn.log_softmax(dense_logits), jax.nn.log_softmax(q_logits)
    assert float(jnp.max(jnp.abs(logp - logp_q))) < 0.25


def test_a_scanned_layer_stack_quantises_as_its_unrolled_layers():
    """Stacked kernels ``[layers, in, out]`` keep blocks per layer and row: the scanned
    model's NF4 base runs the same numbers as the unrolled one's."""
    ids = jnp.arange(10)[None] % CONFIG.vocab_size
    logits = []
    for scan in (False, True):
        graphdef, state = nnx.split(CausalLM(CONFIG, rngs=nnx.Rngs(0), scan_layers=scan))
        qlora = QLoRA(state, 4, 8.0)
        stored = qlora.quantize(state)
        if scan:
            codes = stored["layers"]["attn"]["q_proj"]["kernel"][CODES].get_value()
            assert codes.shape == (CONFIG.num_layers, 128, 64)
        logits.append(np.asarray(nnx.merge(graphdef, dequantize_state(stored))(ids)))
    np.testing.assert_allclose(logits[1], logits[0], atol=2e-6)


def _sft_trainer(tmp_path, *extra):
    from tests.test_sft import _trainer

    return _trainer(tmp_path, "actor.model.lora_rank=4", "actor.model.lora_alpha=8", "actor.model.base_qtype=nf4",
                    *extra)


def test_only_the_adapters_get_gradients_and_change(tmp_path):
    """A QLoRA sft run: the base is stored in NF4 in the train state; its gradient is one
    zero per leaf (never a base-sized array), the optimiser leaves it bit for bit, and the
    adapters move. Its first loss is the dense model's within NF4's error."""
    from tests.test_sft import _trainer
    from rlinf_jax.tasks.sft.lm import train_step
    from rlinf_jax.tasks.sft.lm_setup import trainable_value_and_grad

    t = _sft_trainer(tmp_path)
    assert isinstance(t.lora, QLoRA) and t.lm.meta["lora"]["base_qtype"] == "nf4"
    ts = t.init()
    assert any(p[-1] == CODES for p, _ in nnx.to_flat_state(ts.params["policy"]))
    batch = jax.device_get(t.next_batch())

    def loss(params, mb):
        from rlinf_jax.tasks.sft.lm_setup import policy_weights

        logp, _ = policy_logprobs(nnx.merge(t.lm.graphdef, policy_weights(t.lora, params)), mb)
        return -jnp.sum(jnp.where(mb["response_mask"] > 0, logp, 0.0))

    _, grads = jax.jit(trainable_value_and_grad(loss, t.lora))(ts.params, batch)
    assert all(g.shape == () and float(g) == 0.0 for g in jax.tree.leaves(grads["policy"]))
    b_grads = [np.abs(np.asarray(g["b"])).max() for g in grads["lora"].values()]
    assert len(b_grads) == 7 and min(b_grads) > 0  # every adapted projection's B learns (A's gradient is 0 at B = 0)

    before = jax.device_get(ts.params)
    losses = []
    for _ in range(3):
        ts, metrics = train_step(t.step_spec, ts, batch)
        losses.append(float(metrics["train/loss"]))
    after = jax.device_get(ts.params)
    for x, y in zip(jax.tree.leaves(before["policy"]), jax.tree.leaves(after["policy"])):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)
    moved = [not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(before["lora"]), jax.tree.leaves(after["lora"]))]
    assert all(moved)
    assert losses[-1] < losses[0]
    dense = _trainer(tmp_path)
    _, m_dense = train_step(dense.step_spec, dense.init(), batch)
    assert losses[0] == pytest.approx(float(m_dense["train/loss"]), rel=0.02)


def test_sgd_on_the_adapters_lowers_the_loss():
    """Five plain SGD steps on the adapters alone, through the NF4 base, lower a token NLL
    step after step."""
    model = CausalLM(CONFIG, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    qlora = QLoRA(state, 4, 4.0)
    stored = qlora.quantize(state)
    rng = np.random.default_rng(0)
    batch = {
        "prompt_ids": jnp.asarray(rng.integers(0, CONFIG.vocab_size, (4, 5))),
        "prompt_mask": jnp.ones((4, 5), jnp.int32),
        "tokens": jnp.asarray(rng.integers(0, CONFIG.vocab_size, (4, 6))),
        "response_mask": jnp.ones((4, 6), jnp.int32),
    }

    @jax.jit
    def loss(adapters):
        logp, _ = policy_logprobs(nnx.merge(graphdef, qlora.merge(stored, adapters)), batch)
        return -jnp.mean(logp)

    tx = optax.sgd(0.05)
    adapters = qlora.init(jax.random.PRNGKey(0))
    opt = tx.init(adapters)
    losses = []
    for _ in range(6):
        value, grads = jax.value_and_grad(loss)(adapters)
        losses.append(float(value))
        updates, opt = tx.update(grads, opt)
        adapters = optax.apply_updates(adapters, updates)
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < losses[0] - 0.5, losses


def test_a_qlora_checkpoint_loads_as_the_dense_merged_model(tmp_path):
    """The train state (uint8 codes among float leaves) saves and restores through the run's
    checkpointer, and ``actor.model.path`` at it gives the dense model: the NF4 base
    dequantised on the host, then the adapters merged."""
    from rlinf_jax.flow.host_loop import checkpoint_state, checkpoint_view
    from rlinf_jax.runtime import Checkpointer
    from rlinf_jax.tasks.sft.lm import train_step
    from rlinf_jax.tasks.sft.lm_model import load_checkpoint_policy
    from rlinf_jax.tasks.sft.lm_setup import policy_weights

    t = _sft_trainer(tmp_path)
    ts, _ = train_step(t.step_spec, t.init(), jax.device_get(t.next_batch()))
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        ckpt.save(1, checkpoint_state(t, ts), t.meta())
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        restored = t.start(ckpt.restore(1, checkpoint_view(t.snapshot(ts)))[0])
    for x, y in zip(jax.tree.leaves(ts.params), jax.tree.leaves(restored.params)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    model, _ = load_checkpoint_policy(tmp_path / "ckpt")
    want = jax.device_get(policy_weights(t.lora, ts.params))
    for (path, got), (_, w) in zip(nnx.to_flat_state(nnx.state(model)), nnx.to_flat_state(want)):
        np.testing.assert_allclose(np.asarray(got.get_value()), np.asarray(w.get_value()), rtol=1e-5, atol=1e-7,
                                   err_msg=str(path))
    flat = {".".join(map(str, p)): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(ts.params["policy"])}
    dense = dequantize_flat(flat)
    assert "layers.0.mlp.up_proj.kernel" in dense and not any(k.endswith(CODES) for k in dense)
    assert "layers.0.attn_norm.scale" in dense  # a norm's "scale" is not mistaken for a block scale


@pytest.mark.slow
def test_reasoning_reference_and_critic_read_the_nf4_base(tmp_path):
    """A QLoRA reasoning run with a KL term and a critic: the reference keeps the NF4 base
    and scores with it dequantised, the critic starts from the dequantised trunk, and the
    update leaves the base alone."""
    from tests.test_reasoning import _fixed_batch, trainer
    from rlinf_jax.tasks.reasoning import update as rl

    t = trainer(tmp_path, "actor.model.lora_rank=4", "actor.model.base_qtype=nf4", "algorithm.lm.kl_coef=0.01",
                "algorithm.adv_type=gae")
    assert any(p[-1] == CODES for p, _ in nnx.to_flat_state(t.reference))
    batch = {k: jnp.asarray(v) for k, v in _fixed_batch(t).items()}
    ref = t._ref_logprobs(t.reference, batch)
    base = nnx.merge(t.lm.graphdef, dequantize_state(t.reference))
    np.testing.assert_allclose(np.asarray(ref), np.asarray(policy_logprobs(base, batch, t.update_spec.temperature)[0]),
                               rtol=1e-5, atol=1e-5)
    trunk = nnx.to_flat_state(t._init_params["value"]["trunk"])
    assert not any(p[-1] == CODES for p, _ in trunk)
    batch["ref_logp"] = ref
    ts = t.init()
    before = jax.device_get(ts.params["policy"])
    new, metrics = rl.update(t.update_spec, ts, batch, jax.random.PRNGKey(0))
    assert float(metrics["train/skipped_updates"]) == 0
    for x, y in zip(jax.tree.leaves(before), jax.tree.leaves(jax.device_get(new.params["policy"]))):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("overrides, message", [
    (["actor.model.base_qtype=nf4"], "base_qtype=nf4 quantises the frozen base of a LoRA run"),
    (["actor.model.base_qtype=int3", "actor.model.lora_rank=4"], "base_qtype='int3' is unknown"),
])
def test_bad_base_qtype_is_one_line(overrides, message):
    with pytest.raises(BadInput, match=message):
        sft_config.check_memory_remedies(load_config("sft_math", overrides).actor.model)
