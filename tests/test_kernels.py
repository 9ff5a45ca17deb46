"""The matrix-product backends (``actor.model.matmul``): MKL's custom call against XLA's dot
(values and gradients, every operand form the models use), a model routed through it against
the same model on XLA, mixed-precision SFT on either backend, and the errors a user meets."""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlinf_jax import kernels
from rlinf_jax.config import load_config
from rlinf_jax.errors import BadInput
from rlinf_jax.kernels import mkl
from rlinf_jax.policies.lm import CausalLM, LMConfig, set_matmul

needs_mkl = pytest.mark.skipif(not mkl.available(), reason='MKL is not installed (pip install -e ".[mkl]")')

# Relative tolerance of one product: float32 sums in another order; bfloat16 inputs are the
# same on both sides and both accumulate in float32, so only the summation order differs too.
TOL = {jnp.float32: 1e-5, jnp.bfloat16: 1e-2}


def _operands(shape_a, shape_b, dtype, seed=0):
    ka, kb = jax.random.split(jax.random.key(seed))
    return jax.random.normal(ka, shape_a).astype(dtype), jax.random.normal(kb, shape_b).astype(dtype)


@needs_mkl
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize(
    "shape_a, shape_b, trans_b",
    [
        ((5, 7), (7, 3), False),  # a dense layer
        ((5, 7), (3, 7), True),  # a tied output head
        ((4, 5, 7), (4, 7, 3), False),  # one product per leading index
        ((2, 3, 5, 7), (2, 3, 7, 6), False),  # attention: (batch, KV head) pairs
        ((5, 0), (0, 3), False),  # an empty contraction is zeros
    ],
)
def test_mkl_products_and_gradients_equal_xla(dtype, shape_a, shape_b, trans_b):
    a, b = _operands(shape_a, shape_b, dtype)
    ours = kernels.matmul(a, b, "mkl", trans_b=trans_b)
    ref = kernels.matmul(a, b, "xla", trans_b=trans_b)
    assert ours.dtype == ref.dtype == jnp.float32 and ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, rtol=TOL[dtype], atol=TOL[dtype])

    # Reference gradients through a float32 jnp.matmul of the same (rounded) inputs.
    w = jax.random.normal(jax.random.key(2), ref.shape)

    def loss(backend, x, y):
        return jnp.sum(kernels.matmul(x, y, backend, trans_b=trans_b) * w)

    got = jax.grad(lambda x, y: loss("mkl", x, y), argnums=(0, 1))(a, b)
    want = jax.grad(lambda x, y: loss("xla", x, y), argnums=(0, 1))(a.astype(jnp.float32), b.astype(jnp.float32))
    for g, r in zip(got, want):
        assert g.dtype == dtype and g.shape == r.shape
        np.testing.assert_allclose(np.asarray(g, np.float32), r, rtol=TOL[dtype], atol=TOL[dtype] * 10)


@needs_mkl
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("lead", [(), (3,)])
def test_float32_operands_of_a_bfloat16_product(trans_b, lead):
    """Float32 operands with ``compute_dtype=bfloat16`` (a float32 weight, rounded by the
    kernel library) give what XLA gives for the operands rounded first: the same product,
    and gradients in float32 that equal XLA's products of the rounded operands."""
    a, b = _operands((*lead, 33, 40), (*lead, 24, 40) if trans_b else (*lead, 40, 24), jnp.float32, seed=3)
    a16, b16 = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
    ours = kernels.matmul(a, b, "mkl", trans_b=trans_b, compute_dtype=jnp.bfloat16)
    ref = kernels.matmul(a16, b16, "xla", trans_b=trans_b)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(kernels.matmul(a, b, "xla", trans_b=trans_b, compute_dtype=jnp.bfloat16), ref,
                               rtol=1e-5, atol=1e-5)

    w = jax.random.normal(jax.random.key(5), ref.shape)
    got = jax.grad(lambda x, y: jnp.sum(kernels.matmul(x, y, "mkl", trans_b=trans_b, compute_dtype=jnp.bfloat16)
                                        * w), argnums=(0, 1))(a, b)
    # The backward products read the rounded operands and the rounded output gradient.
    w16, f = w.astype(jnp.bfloat16).astype(jnp.float32), jnp.float32
    a_r, b_r = a16.astype(f), b16.astype(f)
    want_a = w16 @ (b_r if trans_b else jnp.swapaxes(b_r, -1, -2))
    want_b = jnp.swapaxes(w16, -1, -2) @ a_r if trans_b else jnp.swapaxes(a_r, -1, -2) @ w16
    for g, r in zip(got, (want_a, want_b)):
        assert g.dtype == jnp.float32 and g.shape == r.shape
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)


@needs_mkl
def test_round_bf16_equals_xlas_convert():
    """The kernel library's rounding is XLA's: to nearest, ties to even, infinities kept,
    NaNs NaN, subnormals and the largest floats included; lengths off the vector width."""
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-42, 3.4e38, -3.4e38,
                         1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 1.0 + 2.0**-9], np.float32)
    rng = np.random.default_rng(0)
    for x in (specials, rng.normal(size=(37,)).astype(np.float32) * 1e3, rng.normal(size=(4, 129)).astype(np.float32)):
        got = np.asarray(jax.jit(mkl.round_bf16)(jnp.asarray(x)), np.float32)
        want = np.asarray(jnp.asarray(x).astype(jnp.bfloat16), np.float32)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(got[~np.isnan(got)], want[~np.isnan(want)])


@needs_mkl
@pytest.mark.parametrize("bias_shape", [(6,), (2, 1, 6)])
def test_bias_gradient_through_mkl_is_the_column_sum(bias_shape):
    """`kernels.add_bias`'s bias gradient (a product with a row of ones) against a numpy sum."""
    y = jax.random.normal(jax.random.key(6), (2, 9, 6))
    bias = jax.random.normal(jax.random.key(7), bias_shape)
    g = np.asarray(jax.random.normal(jax.random.key(8), y.shape))
    _, vjp = jax.vjp(lambda y, b: kernels.add_bias(y, b, "mkl"), y, bias)
    dy, db = vjp(jnp.asarray(g))
    np.testing.assert_array_equal(dy, g)
    want = g.sum(axis=(0, 1)) if len(bias_shape) == 1 else g.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(db, want, rtol=1e-5, atol=1e-5)


@needs_mkl
def test_swiglu_in_the_kernel_library_equals_autodiff():
    """``mkl.swiglu`` (the MLP's ``silu(gate) * up`` on float32 models through MKL) and its
    backward pass against autodiff of the plain expression, with gates far out on both
    sides (the sigmoid's exponential clamped, never inf or NaN), under jit and vmap."""
    gate = jax.random.normal(jax.random.key(9), (3, 37, 129)) * 4
    gate = gate.at[0, 0, :4].set(jnp.array([-200.0, 200.0, 0.0, -88.0]))
    up = jax.random.normal(jax.random.key(10), gate.shape)
    w = jax.random.normal(jax.random.key(11), gate.shape)
    plain = lambda g, u: jax.nn.silu(g) * u  # noqa: E731
    np.testing.assert_allclose(mkl.swiglu(gate, up), plain(gate, up), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(jax.jit(jax.vmap(mkl.swiglu))(gate, up), plain(gate, up), rtol=1e-6, atol=1e-6)

    def grads(f):
        return jax.jit(jax.grad(lambda g, u: jnp.sum(f(g, u) * w), argnums=(0, 1)))(gate, up)

    for got, want in zip(grads(mkl.swiglu), grads(plain)):
        assert bool(jnp.all(jnp.isfinite(got)))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@needs_mkl
def test_mkl_products_under_vmap_and_jit():
    a, b = _operands((3, 4, 5), (3, 5, 2), jnp.float32)
    ours = jax.jit(jax.vmap(lambda x, y: kernels.matmul(x, y, "mkl")))(a, b)
    np.testing.assert_allclose(ours, jnp.matmul(a, b), rtol=1e-5, atol=1e-5)


def _tiny(tie: bool) -> LMConfig:
    return LMConfig.from_hf_config({
        "model_type": "qwen2", "vocab_size": 50, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "tie_word_embeddings": tie, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
    })


@pytest.mark.slow
@needs_mkl
@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_model_through_mkl_equals_the_model_on_xla(tie, dtype):
    """Loss and every parameter's gradient, and a cached prefill + decode step (the sampler's
    path), with bfloat16 compute over float32 parameters or all in float32."""
    models = [CausalLM(_tiny(tie), dtype=dtype, param_dtype=jnp.float32, rngs=nnx.Rngs(0), matmul=m)
              for m in ("xla", "mkl")]
    ids = jax.random.randint(jax.random.key(1), (3, 7), 0, 50)
    mask = jnp.ones((3, 7), jnp.int32).at[0, :2].set(0)  # a left-padded row

    def loss(model):
        logp = jax.nn.log_softmax(model(ids, mask)[:, :-1])
        return -jnp.mean(jnp.take_along_axis(logp, ids[:, 1:, None], -1))

    (l_xla, g_xla), (l_mkl, g_mkl) = (nnx.value_and_grad(loss)(m) for m in models)
    tol = TOL[dtype]
    assert float(l_mkl) == pytest.approx(float(l_xla), rel=tol)
    scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(g_xla))
    for gx, gm in zip(jax.tree.leaves(g_xla), jax.tree.leaves(g_mkl)):
        np.testing.assert_allclose(gm, gx, atol=tol * scale * (1 if dtype == jnp.float32 else 5))

    def prefill_decode(model):
        cache = model.init_cache(3, 9)
        full_mask = jnp.concatenate([mask, jnp.ones((3, 2), jnp.int32)], axis=1)
        logits, cache = model(ids, full_mask, cache=cache, cache_index=0)
        step, _ = model(ids[:, -1:], full_mask, cache=cache, cache_index=7)
        return logits, step

    for x, m in zip(prefill_decode(models[0]), prefill_decode(models[1])):
        np.testing.assert_allclose(m, x, rtol=tol, atol=tol * 10)


@needs_mkl
def test_set_matmul_reroutes_a_built_model():
    model = CausalLM(_tiny(True), rngs=nnx.Rngs(0))
    ids = jnp.arange(6)[None] % 50
    before = model(ids)
    set_matmul(model, "mkl")
    assert {m.matmul for _, m in nnx.iter_modules(model) if hasattr(m, "matmul")} == {"mkl"}
    hlo = jax.jit(lambda i: model(i)).lower(ids).as_text()
    assert "mkl_gemm_f32" in hlo and "dot_general" not in hlo  # every product is the custom call
    np.testing.assert_allclose(model(ids), before, rtol=1e-5, atol=1e-5)


TINY_SFT = [
    "actor.model.lm.hidden_size=32", "actor.model.lm.intermediate_size=64", "actor.model.lm.num_layers=1",
    "actor.model.lm.num_heads=2", "actor.model.lm.num_kv_heads=1", "data.eval_size=16",
    "rollout.max_new_tokens=12", "rollout.eval_batch_size=16", "runner.progress_bar=false",
    "runner.tensorboard=false", "actor.global_batch_size=16", "actor.micro_batch_size=8",
    "actor.optim.warmup_steps=0", "actor.optim.lr=3e-3", "runner.max_steps=12", "runner.log_interval=1",
    "runner.eval_interval=0", "runner.save_interval=0",
]


@needs_mkl
@pytest.mark.slow
def test_mixed_precision_sft_learns_alike_on_both_backends(tmp_path):
    """bfloat16 products over float32 parameters: the loss curve of 12 steps through MKL
    follows XLA's, both follow the all-float32 run's, and parameters and optimiser state
    stay float32."""
    from rlinf_jax.runtime import read_metrics
    from rlinf_jax.tasks.sft.lm import SFTTrainer
    from rlinf_jax.cli.train import main

    mixed = ["actor.model.dtype=bfloat16", "actor.model.param_dtype=float32"]
    curves = {}
    for name, extra in (("xla", mixed), ("mkl", [*mixed, "actor.model.matmul=mkl"]), ("float32", [])):
        args = [*TINY_SFT, *extra, f"runner.output_dir={tmp_path}", f"runner.experiment_name={name}"]
        assert main(["--config-name", "sft_math", *args]) == 0
        curves[name] = np.array([r["train/loss"] for r in read_metrics(tmp_path / name) if "train/loss" in r])
    assert len(curves["mkl"]) == 12
    assert curves["mkl"][-1] < curves["mkl"][0] - 0.5, curves["mkl"]  # it learns
    np.testing.assert_allclose(curves["mkl"], curves["xla"], rtol=0.02)
    np.testing.assert_allclose(curves["mkl"], curves["float32"], rtol=0.03)

    cfg = load_config("sft_math", [*TINY_SFT, *mixed, "actor.model.matmul=mkl", f"runner.output_dir={tmp_path}"])
    ts = SFTTrainer(cfg).init()
    dtypes = {x.dtype for x in jax.tree.leaves((ts.params, ts.opt_state)) if jnp.issubdtype(x.dtype, jnp.floating)}
    assert dtypes == {jnp.dtype(jnp.float32)}


def test_bad_backend_settings_are_one_line_errors(tmp_path, capsys):
    from rlinf_jax.cli.train import main

    base = ["--config-name", "sft_math", *TINY_SFT, f"runner.output_dir={tmp_path}"]
    assert main([*base, "actor.model.matmul=cublas"]) == 2
    assert "actor.model.matmul='cublas' is unknown; choose one of xla, mkl" in capsys.readouterr().err
    assert main([*base, "actor.model.param_dtype=float64"]) == 2
    assert "actor.model.param_dtype: dtype 'float64' is not supported" in capsys.readouterr().err
    assert not (tmp_path / "sft").exists()  # nothing written

    with pytest.raises(BadInput, match="computes in float32 or bfloat16, not float16"):
        kernels.check_backend("mkl", jnp.float16)
    with pytest.raises(BadInput, match="runs its custom call on one device, and this run uses 2"):
        kernels.check_backend("mkl", jnp.float32, 2)
    if mkl.available():
        kernels.check_backend("mkl", jnp.bfloat16, 1)  # builds or loads the kernel


def test_missing_mkl_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.delenv("MKLROOT", raising=False)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    with pytest.raises(BadInput, match=r'needs Intel MKL.*pip install -e "\.\[mkl\]"'):
        mkl.build()


def _sac_steps(extra, steps=3):
    """The sac_brax learner's first ``steps`` gradient steps on fixed random batches: the
    critic losses and the final actor and critic parameters."""
    from rlinf_jax.replay import TransitionBatch
    from rlinf_jax.tasks.offpolicy import learner as lib
    from rlinf_jax.tasks.offpolicy import algorithm as off_policy
    from rlinf_jax.tasks.offpolicy.setup import make_setup
    from rlinf_jax.tasks.registry import load_run_config

    cfg = load_run_config("sac_brax", ["runner.progress_bar=false", "runner.tensorboard=false", "env.num_envs=4",
                                       "algorithm.offpolicy.batch_size=32", *extra])
    setup = make_setup(cfg)
    obs, act = setup.env.observation_size, setup.env.action_size
    key = jax.random.PRNGKey(0)
    env_state = jax.jit(setup.env.reset)(key)
    state = off_policy.initial_state(cfg, setup, setup.learner, key, env_state,
                                     off_policy.empty_replay(setup.learner, setup, env_state.obs, act))
    rng = np.random.default_rng(0)
    step = jax.jit(lambda s, b, k: lib.sac_step(setup.learner, s, b, k))
    losses = []
    for i in range(steps):
        batch = TransitionBatch(
            obs=jnp.asarray(rng.normal(size=(32, obs)), jnp.float32),
            action=jnp.asarray(rng.uniform(-1, 1, (32, act)), jnp.float32),
            reward=jnp.asarray(rng.normal(size=(32,)), jnp.float32),
            next_obs=jnp.asarray(rng.normal(size=(32, obs)), jnp.float32),
            terminated=jnp.zeros((32,), jnp.float32),
        )
        state, _, metrics = step(state, batch, jax.random.PRNGKey(i))
        losses.append(float(metrics["train/critic_loss"]))
    return np.array(losses), state


@needs_mkl
@pytest.mark.slow
def test_sac_steps_through_mkl_equal_xla_and_bfloat16_stays_close():
    """The off-policy actor and critics through MKL: float32 steps equal XLA's; bfloat16
    products (mixed precision) stay within a few percent of them."""
    ref_losses, ref = _sac_steps([])
    losses, state = _sac_steps(["actor.model.matmul=mkl"])
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-4)
    for a, b in zip(jax.tree.leaves((state.actor, state.critic)), jax.tree.leaves((ref.actor, ref.critic))):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    bf16_losses, _ = _sac_steps(["actor.model.matmul=mkl", "actor.model.compute_dtype=bfloat16"])
    np.testing.assert_allclose(bf16_losses, ref_losses, rtol=0.05)
