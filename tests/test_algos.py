"""The RL math against independent references: naive loops and hand-computed examples."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rlinf_jax.algos import gae, ppo_policy_loss, value_loss


def naive_gae(rewards, values, dones, last_value, gamma, lam, truncations=None, final_values=None):
    T, B = rewards.shape
    adv = np.zeros((T, B))
    for b in range(B):
        running = 0.0
        for t in reversed(range(T)):
            if dones[t, b]:
                nv = final_values[t, b] if truncations is not None and truncations[t, b] else 0.0
                running = rewards[t, b] + gamma * nv - values[t, b]
            else:
                nv = values[t + 1, b] if t + 1 < T else last_value[b]
                running = rewards[t, b] + gamma * nv - values[t, b] + gamma * lam * running
            adv[t, b] = running
    return adv, adv + values


def test_gae_hand_example():
    # T=2, B=1, no dones: delta1 = 1 + .5*3 - 2 = .5; delta0 = 1 + .5*2 - 1 = 1;
    # A1 = .5, A0 = 1 + .5*.5*.5 = 1.125
    adv, ret = gae(np.array([[1.0], [1.0]]), np.array([[1.0], [2.0]]), np.zeros((2, 1)), np.array([3.0]), 0.5, 0.5)
    np.testing.assert_allclose(np.asarray(adv)[:, 0], [1.125, 0.5])
    np.testing.assert_allclose(np.asarray(ret)[:, 0], [2.125, 2.5])


def test_gae_truncation_bootstraps_final_value():
    r, v = np.array([[1.0], [1.0]]), np.array([[0.0], [0.0]])
    d = np.array([[1.0], [0.0]])
    terminated, _ = gae(r, v, d, np.array([0.0]), 0.9, 1.0)
    truncated, _ = gae(r, v, d, np.array([0.0]), 0.9, 1.0, np.array([[1.0], [0.0]]), np.array([[10.0], [0.0]]))
    assert float(terminated[0, 0]) == pytest.approx(1.0)
    assert float(truncated[0, 0]) == pytest.approx(1.0 + 0.9 * 10.0)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    T=st.integers(1, 12),
    B=st.integers(1, 4),
    gamma=st.floats(0.0, 1.0),
    lam=st.floats(0.0, 1.0),
)
def test_gae_matches_naive_loop(seed, T, B, gamma, lam):
    rng = np.random.default_rng(seed)
    r = rng.normal(size=(T, B))
    v = rng.normal(size=(T, B))
    d = (rng.random((T, B)) < 0.3).astype(np.float64)
    tr = d * (rng.random((T, B)) < 0.5)
    fv = rng.normal(size=(T, B))
    lv = rng.normal(size=B)
    adv, ret = gae(r, v, d, lv, gamma, lam, tr, fv)
    ref_adv, ref_ret = naive_gae(r, v, d, lv, gamma, lam, tr, fv)
    np.testing.assert_allclose(np.asarray(adv), ref_adv, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(ret), ref_ret, rtol=1e-4, atol=1e-4)


def test_ppo_policy_loss_hand_example():
    # ratios: e^0.5=1.6487 (A=+1, clipped at 1.2), e^-0.5=0.6065 (A=-2: min(-1.213, -1.6) = -1.6),
    # e^0.1 = 1.1052 (A=3, inside the band). loss = -mean(1.2, -1.6, 3.3155); the clipped
    # term is the one taken for the first two tokens.
    logp = np.array([0.5, -0.5, 0.2])
    old = np.array([0.0, 0.0, 0.1])
    adv = np.array([1.0, -2.0, 3.0])
    loss, m = ppo_policy_loss(logp, old, adv, clip_low=0.2, clip_high=0.2)
    assert float(loss) == pytest.approx(-(1.2 - 1.6 + 3.0 * np.exp(0.1)) / 3, rel=1e-5)
    assert float(m["clip_fraction"]) == pytest.approx(2 / 3)
    assert float(m["approx_kl"]) == pytest.approx(np.mean(old - logp), abs=1e-7)  # k1


def test_ppo_policy_loss_mask_ignores_padding():
    loss, _ = ppo_policy_loss(np.array([0.0, 5.0]), np.zeros(2), np.array([2.0, 100.0]), mask=np.array([1.0, 0.0]))
    assert float(loss) == pytest.approx(-2.0)


def test_value_loss_hand_example():
    assert float(value_loss(np.array([1.0, 3.0]), None, np.array([0.0, 1.0]))) == pytest.approx(0.5 * (1 + 4) / 2)
