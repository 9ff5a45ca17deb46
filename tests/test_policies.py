"""Tanh-Gaussian policy math against closed forms and numerical integration."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlinf_jax.policies import distributions as dist
from rlinf_jax.policies.mlp import ActorCritic, act, evaluate_actions


def test_tanh_normal_log_prob_matches_change_of_variables():
    loc, scale, raw = np.array([0.3]), np.array([0.7]), np.array([0.9])
    a = np.tanh(raw)
    gauss = -0.5 * ((raw - loc) / scale) ** 2 - np.log(scale) - 0.5 * np.log(2 * np.pi)
    expected = gauss - np.log(1 - a**2)
    np.testing.assert_allclose(dist.tanh_normal_log_prob(loc, scale, raw), expected.sum(), rtol=1e-5)


def test_tanh_normal_density_integrates_to_one():
    # Density over the squashed action a in (-1, 1): integrate exp(logp(atanh a)) / (1 - a^2) da
    # equals integrating the raw density, so sum over a fine raw grid.
    raw = np.linspace(-8, 8, 20001)[:, None]
    p = np.exp(np.asarray(dist.tanh_normal_log_prob(jnp.array([0.2]), jnp.array([0.5]), raw)))
    a = np.tanh(raw[:, 0])
    np.testing.assert_allclose(np.trapezoid(p, a), 1.0, atol=1e-3)


def test_actor_critic_act_logprob_consistent():
    model = ActorCritic(5, 3, (16,), (16,), rngs=nnx.Rngs(0))
    obs = jax.random.normal(jax.random.PRNGKey(1), (7, 5))
    action, raw, logp = act(model, obs, jax.random.PRNGKey(2))
    assert action.shape == (7, 3) and logp.shape == (7,)
    assert np.all(np.abs(np.asarray(action)) <= 1)
    logp2, ent, value = evaluate_actions(model, obs, raw, jax.random.PRNGKey(3))
    np.testing.assert_allclose(logp, logp2, rtol=1e-5)
    assert value.shape == (7,) and ent.shape == (7,)


def test_bfloat16_compute_keeps_float32_parameters_and_gradients():
    """actor.model.compute_dtype=bfloat16: the products run in bfloat16 (so the outputs
    differ from float32's by bfloat16's rounding, and no more), while parameters, gradients
    and what the loss sees stay float32."""
    from rlinf_jax.config import load_config
    from rlinf_jax.errors import BadInput
    from rlinf_jax.policies import mlp
    from rlinf_jax.tasks.embodied.config import check

    obs = jax.random.normal(jax.random.PRNGKey(1), (64, 5))
    raw = jax.random.normal(jax.random.PRNGKey(2), (64, 3))
    out = {}
    for dtype in ("float32", "bfloat16"):
        graph, params = nnx.split(mlp.ActorCritic(5, 3, (32, 32), (32, 32), rngs=nnx.Rngs(0), compute_dtype=dtype))
        assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}

        def loss(p):
            logp, _, value = mlp.evaluate_actions(nnx.merge(graph, p), obs, raw, jax.random.PRNGKey(3))
            return -logp.mean() + jnp.mean(value**2), (logp, value)

        (value, (logp, v)), grads = jax.value_and_grad(loss, has_aux=True)(params)
        assert logp.dtype == v.dtype == jnp.float32
        assert {x.dtype for x in jax.tree.leaves(grads)} == {jnp.dtype(jnp.float32)}
        out[dtype] = (value, v, grads)
    # Same parameters (same seed): bfloat16's 8-bit mantissa is the only difference.
    np.testing.assert_allclose(out["bfloat16"][1], out["float32"][1], rtol=0.05, atol=0.02)
    assert abs(float(out["bfloat16"][0] - out["float32"][0])) < 0.05 * abs(float(out["float32"][0]))
    assert not np.array_equal(np.asarray(out["bfloat16"][1]), np.asarray(out["float32"][1]))  # it did run in bf16
    with pytest.raises(BadInput, match="actor.model.compute_dtype='float16' is unknown"):
        check(load_config("ppo_brax", ["actor.model.compute_dtype=float16"]))
