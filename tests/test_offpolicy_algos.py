"""The off-policy losses against hand-computed examples and naive loops."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlinf_jax.algos import offpolicy as op


def test_soft_q_target_by_hand():
    # Two transitions: the second is terminal (no bootstrap).
    reward = jnp.array([1.0, 2.0])
    terminated = jnp.array([0.0, 1.0])
    next_q = jnp.array([5.0, 7.0])
    next_logprob = jnp.array([-1.0, 3.0])
    y = op.soft_q_target(reward, terminated, next_q, next_logprob, alpha=0.2, gamma=0.9)
    # 1 + 0.9 * (5 - 0.2 * -1) = 1 + 0.9 * 5.2 = 5.68; 2 (terminal)
    np.testing.assert_allclose(y, [5.68, 2.0], rtol=1e-6)
    # No gradient flows into the target.
    g = jax.grad(lambda q: op.soft_q_target(reward, terminated, q, next_logprob, 0.2, 0.9).sum())(next_q)
    assert np.all(np.asarray(g) == 0)


def test_ensemble_min_over_all_and_over_a_random_subset():
    qs = jnp.array([[3.0, 1.0], [2.0, 5.0], [4.0, 0.5], [1.5, 9.0]])
    np.testing.assert_allclose(op.ensemble_min(qs), [1.5, 0.5])
    # REDQ: the minimum over the drawn subset, the same subset for every column.
    for seed in range(20):
        key = jax.random.PRNGKey(seed)
        got = np.asarray(op.ensemble_min(qs, key, 2))
        members = np.asarray(jax.random.choice(key, 4, (2,), replace=False))
        assert len(set(members.tolist())) == 2
        np.testing.assert_allclose(got, np.asarray(qs)[members].min(axis=0))
    # Over many draws every pair shows up: the subset is random, not fixed.
    pairs = {tuple(sorted(np.asarray(jax.random.choice(jax.random.PRNGKey(s), 4, (2,), replace=False)).tolist()))
             for s in range(200)}
    assert pairs == set(itertools.combinations(range(4), 2))
    # num_min >= N is the plain minimum.
    np.testing.assert_allclose(op.ensemble_min(qs, jax.random.PRNGKey(0), 4), [1.5, 0.5])


def test_ensemble_regression_is_a_sum_of_per_member_mses():
    rng = np.random.default_rng(0)
    q = rng.normal(size=(3, 5)).astype(np.float32)
    y = rng.normal(size=5).astype(np.float32)
    naive = 0.0
    for i in range(3):
        naive += 0.5 * sum((q[i, b] - y[b]) ** 2 for b in range(5)) / 5
    np.testing.assert_allclose(op.ensemble_regression(jnp.asarray(q), jnp.asarray(y)), naive, rtol=1e-6)


def test_actor_loss_min_and_mean_by_hand():
    logprob = jnp.array([-1.0, 0.5])
    q = jnp.array([[2.0, 4.0], [3.0, 1.0]])
    # min: [2, 1]; 0.1 * logp - min = [-0.1 - 2, 0.05 - 1] = [-2.1, -0.95] -> mean -1.525
    np.testing.assert_allclose(op.actor_loss(logprob, q, 0.1, "min"), -1.525, rtol=1e-6)
    # mean: [2.5, 2.5]; [-0.1 - 2.5, 0.05 - 2.5] -> mean (-2.6 - 2.45) / 2 = -2.525
    np.testing.assert_allclose(op.actor_loss(logprob, q, 0.1, "mean"), -2.525, rtol=1e-6)
    with pytest.raises(ValueError):
        op.actor_loss(logprob, q, 0.1, "max")


def test_temperature_loss_moves_alpha_toward_the_target_entropy():
    target = -2.0
    low_entropy = jnp.array([3.0, 3.0])  # -log pi = -3 < target: too little entropy
    high_entropy = jnp.array([-5.0, -5.0])  # -log pi = 5 > target
    log_alpha = jnp.log(0.5)
    # alpha * (-logp - H) = 0.5 * (-3 + 2) = -0.5
    np.testing.assert_allclose(op.temperature_loss(log_alpha, low_entropy, target), -0.5, rtol=1e-6)
    g_low = jax.grad(op.temperature_loss)(log_alpha, low_entropy, target)
    g_high = jax.grad(op.temperature_loss)(log_alpha, high_entropy, target)
    assert g_low < 0 < g_high  # gradient descent raises alpha when entropy is low, lowers it when high
    assert jax.grad(op.temperature_loss, argnums=1)(log_alpha, low_entropy, target).tolist() == [0.0, 0.0]


def test_polyak_by_hand():
    target = {"w": jnp.array([1.0, 2.0]), "b": jnp.array(4.0)}
    online = {"w": jnp.array([3.0, 0.0]), "b": jnp.array(0.0)}
    out = op.polyak(target, online, 0.25)
    np.testing.assert_allclose(out["w"], [1.5, 1.5])
    np.testing.assert_allclose(out["b"], 3.0)


def test_expectile_loss_by_hand_and_its_minimiser_is_the_expectile():
    diff = jnp.array([-2.0, 1.0, 0.0])
    np.testing.assert_allclose(op.expectile_loss(diff, 0.7), [0.3 * 4.0, 0.7 * 1.0, 0.0], rtol=1e-6)
    # The value v minimising E[L(x - v)] over samples x is their tau-expectile: solve by a
    # naive grid search and compare with the fixed point of the expectile equation.
    x = np.array([0.0, 1.0, 2.0, 10.0])
    grid = np.linspace(-1, 11, 120001)
    losses = [float(np.mean(np.where(x - v < 0, 0.1, 0.9) * (x - v) ** 2)) for v in grid[::100]]
    v_grid = grid[::100][int(np.argmin(losses))]
    v = 3.0
    for _ in range(200):  # the expectile satisfies v = sum(w x) / sum(w), w = |tau - 1(x < v)|
        w = np.where(x < v, 0.1, 0.9)
        v = float(np.sum(w * x) / np.sum(w))
    assert abs(v - v_grid) < 0.02 and v > np.mean(x)  # the upper expectile exceeds the mean
    loss_at = lambda u: op.iql_value_loss(jnp.asarray(x, jnp.float32), jnp.full(4, u, jnp.float32), 0.9)  # noqa: E731
    assert float(loss_at(v)) <= float(loss_at(v + 0.05)) and float(loss_at(v)) <= float(loss_at(v - 0.05))


def test_iql_value_loss_holds_q_fixed_and_q_target_by_hand():
    q_target = jnp.array([1.0, 3.0])
    value = jnp.array([2.0, 2.0])
    # diffs [-1, 1]: (0.3 * 1 + 0.7 * 1) / 2 = 0.5
    np.testing.assert_allclose(op.iql_value_loss(q_target, value, 0.7), 0.5, rtol=1e-6)
    assert jax.grad(lambda q: op.iql_value_loss(q, value, 0.7))(q_target).tolist() == [0.0, 0.0]
    y = op.iql_q_target(jnp.array([1.0, 1.0]), jnp.array([0.0, 1.0]), jnp.array([10.0, 10.0]), 0.99)
    np.testing.assert_allclose(y, [10.9, 1.0], rtol=1e-6)


def test_awr_weights_are_clipped_and_the_loss_is_weighted_nll():
    adv = jnp.array([0.0, 1.0, 10.0])
    w = op.awr_weights(adv, temperature=3.0, max_weight=100.0)
    np.testing.assert_allclose(w, [1.0, np.exp(3.0), 100.0], rtol=1e-6)
    logprob = jnp.array([-1.0, -2.0, -0.5])
    naive = -(1.0 * -1.0 + np.exp(3.0) * -2.0 + 100.0 * -0.5) / 3
    np.testing.assert_allclose(op.awr_actor_loss(logprob, adv, 3.0), naive, rtol=1e-6)
    # The weights carry no gradient: only log pi is trained.
    g = jax.grad(lambda a: op.awr_actor_loss(logprob, a, 3.0))(adv)
    assert np.all(np.asarray(g) == 0)


def test_every_loss_jits_to_the_numbers_it_gives_eagerly():
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.normal(size=(4, 3)), jnp.float32)
    key = jax.random.PRNGKey(0)
    r, d, v, lp = (jnp.asarray(rng.normal(size=3), jnp.float32) for _ in range(4))
    cases = [
        (op.ensemble_min, (q, key, 2), 2),
        (op.soft_q_target, (r, d, v, lp, 0.1, 0.99), 5),
        (op.actor_loss, (lp, q, 0.1, "mean"), 3),
        (op.awr_actor_loss, (lp, r, 3.0, 100.0), (2, 3)),
    ]
    for fn, args, static in cases:
        np.testing.assert_allclose(jax.jit(fn, static_argnums=static)(*args), fn(*args), rtol=1e-6, err_msg=fn.__name__)
