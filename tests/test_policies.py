"""Tanh-Gaussian policy math against closed forms and numerical integration."""

import jax
import jax.numpy as jnp
import numpy as np
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
