"""The algorithm library against independent references: plain Python loops over numpy
arrays and hand-computed numbers, plus hypothesis properties."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlinf_jax.algos import (
    aggregate,
    decoupled_ppo_loss,
    dr_grpo,
    entropy_from_logits,
    get_advantage,
    get_aggregation,
    get_kl,
    get_policy_loss,
    grpo,
    informative_groups,
    kl_penalty,
    ppo_policy_loss,
    registry,
    reinforce_pp,
    reinforce_pp_baseline,
    rloo,
    value_loss,
)
from rlinf_jax.errors import BadInput

FAST = settings(max_examples=25, deadline=None)
TOL = {"rtol": 1e-4, "atol": 1e-4}


# ------------------------------------------------------------------ naive references


def naive_grpo(r, g, eps=1e-6, normalize_std=True):
    out = []
    for start in range(0, len(r), g):
        grp = [float(x) for x in r[start : start + g]]
        mean = sum(grp) / g
        if max(grp) == min(grp):
            out += [0.0] * g
            continue
        std = math.sqrt(sum((x - mean) ** 2 for x in grp) / (g - 1))
        out += [(x - mean) / (std + eps) if normalize_std else x - mean for x in grp]
    return np.array(out)


def naive_rloo(r, g):
    out = []
    for start in range(0, len(r), g):
        grp = list(r[start : start + g])
        for i, x in enumerate(grp):
            others = grp[:i] + grp[i + 1 :]
            out.append(x - sum(others) / len(others))
    return np.array(out)


def naive_rtg(rew, mask, gamma):
    B, L = rew.shape
    G = np.zeros((B, L))
    for b in range(B):
        for t in range(L):
            if not mask[b, t]:
                continue
            total, power = 0.0, 0
            for k in range(t, L):
                if mask[b, k]:
                    total += gamma**power * rew[b, k]
                    power += 1
            G[b, t] = total
    return G


def naive_whiten(G, mask, eps, floor=False):
    """(G - mean) / sqrt(var + eps), or / sqrt(max(var, eps)) with ``floor``, over valid tokens."""
    vals = [G[b, t] for b in range(G.shape[0]) for t in range(G.shape[1]) if mask[b, t]]
    if not vals:
        return np.zeros_like(G)
    mean = sum(vals) / len(vals)
    var = sum((v - mean) ** 2 for v in vals) / len(vals)
    scale = math.sqrt(max(var, eps)) if floor else math.sqrt(var + eps)
    out = np.zeros_like(G)
    for b in range(G.shape[0]):
        for t in range(G.shape[1]):
            if mask[b, t]:
                out[b, t] = (G[b, t] - mean) / scale
    return out


def naive_aggregate(x, m, mode, max_len=None):
    B, L = x.shape
    if mode == "token-mean":
        num = sum(x[b, t] * m[b, t] for b in range(B) for t in range(L) if m[b, t])
        den = sum(m[b, t] for b in range(B) for t in range(L))
        return num / den if den else 0.0
    if mode == "seq-mean-token-sum":
        return sum(sum(x[b, t] * m[b, t] for t in range(L) if m[b, t]) for b in range(B)) / B
    if mode == "seq-mean-token-mean":
        per = []
        for b in range(B):
            c = sum(m[b])
            if c:
                per.append(sum(x[b, t] * m[b, t] for t in range(L) if m[b, t]) / c)
        return sum(per) / len(per) if per else 0.0
    if mode == "seq-mean-token-sum-norm":
        return sum(x[b, t] * m[b, t] for b in range(B) for t in range(L) if m[b, t]) / (B * (max_len or L))
    raise AssertionError(mode)


def naive_ppo_token(lp, olp, a, cl, ch, dual):
    ratio = math.exp(lp - olp)
    clipped = min(max(ratio, 1 - cl), 1 + ch)
    loss = max(-a * ratio, -a * clipped)
    if dual is not None:
        loss = min(loss, dual * abs(a))
    return loss


def naive_ppo(lp, olp, adv, mask, cl, ch, dual, agg):
    B, L = adv.shape
    per = np.zeros((B, L))
    for b in range(B):
        for t in range(L):
            if mask[b, t]:
                per[b, t] = naive_ppo_token(lp[b, t], olp[b, t], adv[b, t], cl, ch, dual)
    return naive_aggregate(per, mask, agg)


def naive_huber(e, d):
    return 0.5 * e * e if abs(e) <= d else d * (abs(e) - 0.5 * d)


def seq_batch(seed, B, L, p_valid=0.8):
    rng = np.random.default_rng(seed)
    mask = (rng.random((B, L)) < p_valid).astype(np.float32)
    return rng, mask


# ------------------------------------------------------------------ advantages


def test_grpo_hand_example():
    # group [1, 2, 3]: mean 2, unbiased std 1 -> [-1, 0, 1] / (1 + eps); group [5, 5, 5] -> zeros.
    adv = np.asarray(grpo(np.array([1.0, 2.0, 3.0, 5.0, 5.0, 5.0]), 3, eps=0.0))
    np.testing.assert_allclose(adv, [-1, 0, 1, 0, 0, 0], atol=1e-6)
    np.testing.assert_allclose(np.asarray(dr_grpo(np.array([1.0, 2.0, 6.0]), 3)), [-2, -1, 3], atol=1e-6)


def test_grpo_all_equal_and_singleton_groups_are_zero_not_nan():
    for r, g in [(np.full(4, 0.1), 4), (np.array([3.0, -1.0]), 1), (np.full(6, 1e6 + 0.3), 3)]:
        adv = np.asarray(grpo(r, g))
        assert np.all(adv == 0.0), adv


@FAST
@given(seed=st.integers(0, 2**31 - 1), groups=st.integers(1, 5), g=st.integers(2, 6), norm=st.booleans())
def test_grpo_matches_naive_and_properties(seed, groups, g, norm):
    rng = np.random.default_rng(seed)
    r = rng.integers(0, 3, size=groups * g).astype(np.float64) + rng.normal(size=groups * g) * (rng.random() < 0.5)
    adv = np.asarray(grpo(r, g, normalize_std=norm))
    np.testing.assert_allclose(adv, naive_grpo(r, g, normalize_std=norm), **TOL)
    # Sums to zero per group.
    np.testing.assert_allclose(adv.reshape(-1, g).sum(axis=1), 0.0, atol=1e-4)
    # Invariant to adding a (per-group) constant.
    shift = np.repeat(rng.integers(-5, 6, size=groups).astype(np.float64), g)
    np.testing.assert_allclose(np.asarray(grpo(r + shift, g, normalize_std=norm)), adv, atol=1e-3)


def test_rloo_hand_example():
    # [1, 0, 2]: 1 - (0+2)/2 = 0; 0 - 1.5 = -1.5; 2 - 0.5 = 1.5
    np.testing.assert_allclose(np.asarray(rloo(np.array([1.0, 0.0, 2.0]), 3)), [0.0, -1.5, 1.5])
    with pytest.raises(ValueError):
        rloo(np.array([1.0, 2.0]), 1)


@FAST
@given(seed=st.integers(0, 2**31 - 1), groups=st.integers(1, 4), g=st.integers(2, 6))
def test_rloo_matches_naive(seed, groups, g):
    r = np.random.default_rng(seed).normal(size=groups * g)
    np.testing.assert_allclose(np.asarray(rloo(r, g)), naive_rloo(r, g), **TOL)


def test_reinforce_pp_hand_example():
    # gamma = 0.5, one sequence [r = 0, 0, 4] fully valid, one [2, pad]:
    # G = [1, 2, 4] and [2, 0]. Valid G = {1, 2, 4, 2}: mean 2.25, pop var
    # (1.5625 + .0625 + 3.0625 + .0625) / 4 = 1.1875.
    rew = np.array([[0.0, 0.0, 4.0], [2.0, 9.0, 0.0]])
    mask = np.array([[1, 1, 1], [1, 0, 0]])
    adv = np.asarray(reinforce_pp(rew, mask, gamma=0.5, eps=0.0))
    s = math.sqrt(1.1875)
    np.testing.assert_allclose(adv, [[(1 - 2.25) / s, (2 - 2.25) / s, (4 - 2.25) / s], [(2 - 2.25) / s, 0, 0]], **TOL)


@FAST
@given(seed=st.integers(0, 2**31 - 1), B=st.integers(1, 4), L=st.integers(1, 7), gamma=st.floats(0.0, 1.0))
def test_reinforce_pp_matches_naive(seed, B, L, gamma):
    rng, mask = seq_batch(seed, B, L)
    rew = rng.normal(size=(B, L))
    ref = naive_whiten(naive_rtg(rew, mask, gamma), mask, 1e-8, floor=True)
    out = np.asarray(reinforce_pp(rew, mask, gamma=gamma))
    np.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-3)
    junk = np.where(mask > 0, rew, 1e6)
    np.testing.assert_allclose(np.asarray(reinforce_pp(junk, mask, gamma=gamma)), out, rtol=1e-6, atol=1e-6)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), groups=st.integers(1, 3), g=st.integers(1, 3), L=st.sampled_from([1, 3, 6]), gamma=st.floats(0.0, 1.0))
def test_reinforce_pp_baseline_matches_naive(seed, groups, g, L, gamma):
    B = groups * g
    rng, mask = seq_batch(seed, B, L)
    rew = rng.normal(size=(B, L))
    # Reference: subtract the group-mean sequence reward from each sequence's last valid token.
    seq = [sum(rew[b, t] for t in range(L) if mask[b, t]) for b in range(B)]
    shaped = rew * mask
    for b in range(B):
        base = sum(seq[(b // g) * g : (b // g) * g + g]) / g
        valid = [t for t in range(L) if mask[b, t]]
        if valid:
            shaped[b, valid[-1]] -= base
    ref = naive_whiten(naive_rtg(shaped, mask, gamma), mask, 1e-8, floor=True)
    out = np.asarray(reinforce_pp_baseline(rew, mask, g, gamma=gamma))
    np.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-3)


def test_whiten_follows_verl_and_openrlhf():
    from rlinf_jax.algos import whiten

    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 5)) * 2 + 1
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], np.float32)
    vals = x[mask > 0]
    # veRL's masked_whiten: unbiased variance + eps inside the root.
    ref = (x - vals.mean()) / np.sqrt(vals.var(ddof=1) + 1e-8) * mask
    np.testing.assert_allclose(np.asarray(whiten(x, mask)), ref, rtol=1e-5, atol=1e-6)
    # OpenRLHF / RLinf REINFORCE++: population variance floored at eps.
    ref = (x - vals.mean()) / np.sqrt(max(vals.var(), 1e-8)) * mask
    np.testing.assert_allclose(np.asarray(whiten(x, mask, floor=True)), ref, rtol=1e-5, atol=1e-6)
    # A constant batch: the floor keeps it finite (0 / 1e-4 = 0).
    assert np.all(np.asarray(whiten(np.ones((2, 2)), np.ones((2, 2)), floor=True)) == 0)


def test_reinforce_pp_baseline_subtracts_the_outcomes_mean_before_the_penalty():
    # Two groups of 2; outcomes on the last valid token, a penalty on every token. The
    # baseline is the group mean of the outcomes alone; the penalty is added afterwards.
    rng = np.random.default_rng(3)
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], np.float32)
    outcome = np.zeros((4, 4), np.float32)
    last = [2, 1, 3, 0]
    scores = np.array([1.0, 0.0, 0.5, 2.0], np.float32)
    outcome[np.arange(4), last] = scores
    penalty = rng.normal(size=(4, 4)).astype(np.float32) * mask
    shaped = outcome + penalty
    for b in range(4):
        shaped[b, last[b]] -= scores[2 * (b // 2) : 2 * (b // 2) + 2].mean()
    ref = naive_whiten(naive_rtg(shaped, mask, 1.0), mask, 1e-8, floor=True)
    out = np.asarray(reinforce_pp_baseline(outcome, mask, 2, token_penalty=penalty))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    # Folding the penalty into the rewards first would move the baseline: not the same.
    folded = np.asarray(reinforce_pp_baseline(outcome + penalty, mask, 2))
    assert np.abs(folded - out).max() > 1e-3


# ------------------------------------------------------------------ aggregation

AGG_MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def test_aggregate_hand_example():
    # x = [[1, 2, 3], [4, 5, 6]], m = [[1, 1, 0], [1, 0, 0]]
    x = np.array([[1.0, 2, 3], [4, 5, 6]])
    m = np.array([[1.0, 1, 0], [1, 0, 0]])
    assert float(aggregate(x, m, "token-mean")) == pytest.approx(7 / 3)
    assert float(aggregate(x, m, "seq-mean-token-sum")) == pytest.approx((3 + 4) / 2)
    assert float(aggregate(x, m, "seq-mean-token-mean")) == pytest.approx((1.5 + 4) / 2)
    assert float(aggregate(x, m, "seq-mean-token-sum-norm")) == pytest.approx(7 / 6)
    assert float(aggregate(x, m, "seq-mean-token-sum-norm", max_len=7)) == pytest.approx(7 / 14)
    for mode in AGG_MODES:
        assert float(aggregate(x, np.zeros_like(m), mode)) == 0.0


@FAST
@given(seed=st.integers(0, 2**31 - 1), B=st.integers(1, 4), L=st.integers(1, 6), mode=st.sampled_from(AGG_MODES))
def test_aggregate_matches_naive_and_ignores_masked(seed, B, L, mode):
    rng, mask = seq_batch(seed, B, L, p_valid=0.6)
    x = rng.normal(size=(B, L))
    out = float(aggregate(x, mask, mode))
    assert out == pytest.approx(naive_aggregate(x, mask, mode), rel=1e-4, abs=1e-5)
    junk = np.where(mask > 0, x, rng.normal(size=(B, L)) * 1e6)
    junk[(mask == 0) & (rng.random((B, L)) < 0.3)] = np.nan
    assert float(aggregate(junk, mask, mode)) == pytest.approx(out, rel=1e-5, abs=1e-6)


@FAST
@given(seed=st.integers(0, 2**31 - 1), B=st.integers(1, 4), L=st.integers(2, 6), n=st.integers(1, 6))
def test_aggregation_modes_agree_on_equal_lengths(seed, B, L, n):
    # With every sequence holding exactly n valid tokens: token-mean == seq-mean-token-mean ==
    # seq-mean-token-sum-norm(max_len=n), and seq-mean-token-sum == n * token-mean.
    n = min(n, L)
    rng = np.random.default_rng(seed)
    mask = np.zeros((B, L))
    for b in range(B):
        mask[b, rng.permutation(L)[:n]] = 1
    x = rng.normal(size=(B, L))
    tm = float(aggregate(x, mask, "token-mean"))
    assert float(aggregate(x, mask, "seq-mean-token-mean")) == pytest.approx(tm, rel=1e-4, abs=1e-5)
    assert float(aggregate(x, mask, "seq-mean-token-sum-norm", max_len=n)) == pytest.approx(tm, rel=1e-4, abs=1e-5)
    assert float(aggregate(x, mask, "seq-mean-token-sum")) == pytest.approx(n * tm, rel=1e-4, abs=1e-5)


# ------------------------------------------------------------------ policy losses


def test_ppo_asymmetric_and_dual_clip_hand_example():
    # ratio e^0.2 = 1.2214 with A=+1: clip_high=0.28 leaves it unclipped -> -1.2214 (0.2 would clip).
    # ratio e^1.5 = 4.4817 with A=-1: max(4.4817, 1.28) = 4.4817; dual clip c=3 -> 3.
    lp, old, adv = np.array([0.2, 1.5]), np.zeros(2), np.array([1.0, -1.0])
    loss, m = ppo_policy_loss(lp, old, adv, clip_low=0.2, clip_high=0.28)
    assert float(loss) == pytest.approx((-math.exp(0.2) + math.exp(1.5)) / 2, rel=1e-5)
    # Neither token takes the clipped term (the second's ratio is outside the band, but
    # with A < 0 the unclipped term is the larger): no clipping to count.
    assert float(m["clip_fraction"]) == 0.0
    _, m = ppo_policy_loss(lp, old, adv, clip_low=0.2, clip_high=0.2)
    assert float(m["clip_fraction"]) == pytest.approx(0.5)  # 0.2 clips the first
    loss, m = ppo_policy_loss(lp, old, adv, clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    assert float(loss) == pytest.approx((-math.exp(0.2) + 3.0) / 2, rel=1e-5)
    assert float(m["dual_clip_fraction"]) == pytest.approx(0.5)


@FAST
@given(
    seed=st.integers(0, 2**31 - 1),
    B=st.integers(1, 3),
    L=st.integers(1, 6),
    cl=st.floats(0.05, 0.5),
    ch=st.floats(0.05, 0.5),
    dual=st.sampled_from([None, 2.0, 3.0]),
    agg=st.sampled_from(AGG_MODES),
)
def test_ppo_matches_naive_and_ignores_masked(seed, B, L, cl, ch, dual, agg):
    rng, mask = seq_batch(seed, B, L)
    lp, olp, adv = rng.normal(size=(B, L)) * 0.5, rng.normal(size=(B, L)) * 0.5, rng.normal(size=(B, L))
    loss, m = ppo_policy_loss(lp, olp, adv, mask, cl, ch, dual, agg)
    assert float(loss) == pytest.approx(naive_ppo(lp, olp, adv, mask, cl, ch, dual, agg), rel=1e-4, abs=1e-5)
    valid = [(b, t) for b in range(B) for t in range(L) if mask[b, t]]
    if valid:
        # The peers' definitions: the clipped term taken; k1 = mean(old - new).
        def taken(b, t):
            r = math.exp(lp[b, t] - olp[b, t])
            return -adv[b, t] * min(max(r, 1 - cl), 1 + ch) > -adv[b, t] * r

        frac = sum(taken(b, t) for b, t in valid) / len(valid)
        kl = sum(olp[b, t] - lp[b, t] for b, t in valid) / len(valid)
        assert float(m["clip_fraction"]) == pytest.approx(frac, abs=1e-6)
        assert float(m["approx_kl"]) == pytest.approx(kl, rel=1e-3, abs=1e-5)
    # Perturbing masked-out positions (even to inf/nan) changes nothing.
    pad = mask == 0
    lp2, olp2, adv2 = lp.copy(), olp.copy(), adv.copy()
    lp2[pad], olp2[pad], adv2[pad] = 50.0, -50.0, np.nan
    loss2, m2 = ppo_policy_loss(lp2, olp2, adv2, mask, cl, ch, dual, agg)
    assert float(loss2) == pytest.approx(float(loss), rel=1e-6, abs=1e-7)
    assert float(m2["approx_kl"]) == pytest.approx(float(m["approx_kl"]), rel=1e-6, abs=1e-7)


@FAST
@given(seed=st.integers(0, 2**31 - 1), n=st.sampled_from([1, 8]), c=st.floats(1.01, 10.0))
def test_dual_clip_never_binds_for_positive_advantages(seed, n, c):
    rng = np.random.default_rng(seed)
    lp, olp = rng.normal(size=n) * 2, rng.normal(size=n) * 2
    adv = np.abs(rng.normal(size=n)) + 1e-3
    plain, _ = ppo_policy_loss(lp, olp, adv)
    dual, m = ppo_policy_loss(lp, olp, adv, dual_clip=c)
    assert float(dual) == float(plain)
    assert float(m["dual_clip_fraction"]) == 0.0


def test_log_ratio_is_clamped_before_exp():
    # As veRL and OpenRLHF: |log ratio| > 20 is clamped, so a token whose probability
    # moved by e^25 gives an e^20-sized loss and no gradient instead of an e^25 one.
    lp, old, adv = np.array([25.0]), np.array([0.0]), np.array([-1.0])
    loss, m = ppo_policy_loss(lp, old, adv)
    assert float(loss) == pytest.approx(math.exp(20.0), rel=1e-5)
    assert float(m["approx_kl"]) == pytest.approx(-20.0)
    grad = jax.grad(lambda x: ppo_policy_loss(x, old, adv)[0])(lp.astype(np.float32))
    assert float(grad[0]) == 0.0


def test_ppo_mask_none_is_all_ones():
    rng = np.random.default_rng(0)
    lp, olp, adv = rng.normal(size=(2, 3)), rng.normal(size=(2, 3)), rng.normal(size=(2, 3))
    a, _ = ppo_policy_loss(lp, olp, adv)
    b, _ = ppo_policy_loss(lp, olp, adv, np.ones((2, 3)))
    assert float(a) == pytest.approx(float(b))


def test_decoupled_ppo_hand_example():
    # Token 0: logp = prox = 0, behav = -0.5 -> ratio 1, w = e^0.5 = 1.6487, A = 2 -> -2 * 1.6487.
    # Token 1: ratio e^0.5 = 1.6487 vs prox with A = 1 -> clipped to 1.2; w = e^0 = 1 -> -1.2.
    # Token 2: w = e^2 = 7.39 > cap 5 -> contributes 0 but stays in the denominator (3 tokens).
    lp = np.array([0.0, 0.5, 0.0])
    prox = np.array([0.0, 0.0, 0.0])
    behav = np.array([-0.5, 0.0, -2.0])
    adv = np.array([2.0, 1.0, 1.0])
    loss, m = decoupled_ppo_loss(lp, prox, behav, adv, behav_weight_cap=5.0)
    assert float(loss) == pytest.approx((-2 * math.exp(0.5) - 1.2) / 3, rel=1e-5)
    assert float(m["behav_masked_fraction"]) == pytest.approx(1 / 3)
    assert float(m["clip_fraction"]) == pytest.approx(1 / 3)
    # Without a cap, token 2 counts with weight e^2.
    loss, _ = decoupled_ppo_loss(lp, prox, behav, adv)
    assert float(loss) == pytest.approx((-2 * math.exp(0.5) - 1.2 - math.exp(2.0)) / 3, rel=1e-5)


def test_decoupled_ppo_equals_ppo_when_on_policy():
    rng = np.random.default_rng(1)
    lp, old, adv = rng.normal(size=(3, 4)), rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    mask = (rng.random((3, 4)) < 0.7).astype(np.float32)
    a, _ = ppo_policy_loss(lp, old, adv, mask, 0.2, 0.28)
    b, _ = decoupled_ppo_loss(lp, old, old, adv, mask, 0.2, 0.28, behav_weight_cap=10.0)
    assert float(a) == pytest.approx(float(b), rel=1e-6)


# ------------------------------------------------------------------ value, KL, entropy


@FAST
@given(
    seed=st.integers(0, 2**31 - 1),
    B=st.integers(1, 3),
    L=st.integers(1, 5),
    clip=st.sampled_from([None, 0.1, 0.5]),
    huber=st.sampled_from([None, 0.5, 2.0]),
)
def test_value_loss_matches_naive_and_ignores_masked(seed, B, L, clip, huber):
    rng, mask = seq_batch(seed, B, L)
    v, ov, ret = rng.normal(size=(B, L)), rng.normal(size=(B, L)), rng.normal(size=(B, L)) * 2
    f = (lambda e: 0.5 * e * e) if huber is None else (lambda e: naive_huber(e, huber))
    per = np.zeros((B, L))
    for b in range(B):
        for t in range(L):
            loss = f(ret[b, t] - v[b, t])
            if clip is not None:
                vc = ov[b, t] + min(max(v[b, t] - ov[b, t], -clip), clip)
                loss = max(loss, f(ret[b, t] - vc))
            per[b, t] = loss
    out = float(value_loss(v, ov, ret, mask, clip=clip, huber_delta=huber))
    assert out == pytest.approx(naive_aggregate(per, mask, "token-mean"), rel=1e-4, abs=1e-6)
    v2 = np.where(mask > 0, v, 1e9)
    assert float(value_loss(v2, ov, ret, mask, clip=clip, huber_delta=huber)) == pytest.approx(out, rel=1e-6, abs=1e-7)


def test_value_loss_huber_hand_example():
    # errors 0.5 and 3 with delta 1: 0.5*0.25 = 0.125 and 1*(3 - 0.5) = 2.5
    out = value_loss(np.array([0.0, 0.0]), None, np.array([0.5, -3.0]), huber_delta=1.0)
    assert float(out) == pytest.approx((0.125 + 2.5) / 2)


def test_kl_penalty_kinds_and_aliases():
    # d = logp - ref = 0.5 and -1
    lp, ref = np.array([0.5, -1.0]), np.zeros(2)
    expect = {
        "k1": [0.5, -1.0],
        "abs": [0.5, 1.0],
        "k2": [0.125, 0.5],
        "k3": [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1 - 1],
    }
    for kind, alias in [("k1", "kl"), ("abs", None), ("k2", "mse"), ("k3", "low_var_kl")]:
        np.testing.assert_allclose(np.asarray(kl_penalty(lp, ref, kind)), expect[kind], rtol=1e-6)
        if alias:
            np.testing.assert_allclose(np.asarray(kl_penalty(lp, ref, alias)), expect[kind], rtol=1e-6)
    with pytest.raises(BadInput, match="k3"):
        kl_penalty(lp, ref, "k4")
    # k3 far from the reference: clamped to 10 (veRL, RLinf), and no gradient there.
    far = np.array([-15.0, 30.0])
    np.testing.assert_allclose(np.asarray(kl_penalty(far, np.zeros(2), "k3")), [10.0, 10.0])
    grad = jax.grad(lambda x: jnp.sum(kl_penalty(x, np.zeros(2), "k3")))(far.astype(np.float32))
    assert np.all(np.asarray(grad) == 0.0)


def test_entropy_from_logits_matches_naive():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 5)) * 3
    logits[0, 0, 1] = -np.inf
    mask = np.array([[1, 1, 0], [1, 0, 1]])
    ref = np.zeros((2, 3))
    for b in range(2):
        for t in range(3):
            if not mask[b, t]:
                continue
            z = [math.exp(v) if v > -np.inf else 0.0 for v in logits[b, t]]
            p = [x / sum(z) for x in z]
            ref[b, t] = -sum(q * math.log(q) for q in p if q > 0)
    np.testing.assert_allclose(np.asarray(entropy_from_logits(logits, mask)), ref, rtol=1e-5, atol=1e-6)
    # Uniform over 4 -> log 4.
    assert float(entropy_from_logits(np.zeros((1, 4)))[0]) == pytest.approx(math.log(4))


# ------------------------------------------------------------------ DAPO


def test_informative_groups():
    r = np.array([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.5, 0.5, 0.5])
    np.testing.assert_array_equal(np.asarray(informative_groups(r, 3)), [False, True, False])


# ------------------------------------------------------------------ registry and jit


def test_registry_names_and_errors():
    assert get_advantage("grpo") is grpo
    np.testing.assert_allclose(np.asarray(get_advantage("dr_grpo")(np.array([1.0, 3.0]), 2)), [-1, 1])
    for name in ["gae", "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"]:
        get_advantage(name)
    for name in ["ppo", "dual_clip_ppo", "decoupled_ppo"]:
        get_policy_loss(name)
    for name in ["k1", "k2", "k3", "abs", "kl", "mse", "low_var_kl"]:
        get_kl(name)
    for name in AGG_MODES:
        get_aggregation(name)
    for fn, key in [(get_advantage, "adv_type"), (get_policy_loss, "loss_type"), (get_kl, "kl_type"), (get_aggregation, "loss_agg")]:
        with pytest.raises(BadInput) as e:
            fn("nope")
        msg = str(e.value)
        assert "\n" not in msg and key in msg and "choose one of" in msg
    with pytest.raises(BadInput):
        aggregate(np.ones((2, 2)), None, "nope")


def test_register_is_one_line():
    try:
        registry.register_advantage("zeros")(lambda rewards, group_size: rewards * 0)
        registry.register_aggregation("max")(lambda x, m, max_len: (x * m).max())
        assert get_advantage("zeros")(np.ones(2), 2).tolist() == [0, 0]
        assert float(aggregate(np.array([[1.0, 5.0]]), np.array([[1.0, 0.0]]), "max")) == 1.0
    finally:
        registry.ADVANTAGES.pop("zeros", None)
        registry.AGGREGATIONS.pop("max", None)


def test_everything_jits():
    rng = np.random.default_rng(0)
    B, L = 4, 5
    x, y, z, w = (rng.normal(size=(B, L)).astype(np.float32) for _ in range(4))
    mask = (rng.random((B, L)) < 0.7).astype(np.float32)
    r = rng.normal(size=8).astype(np.float32)
    cases = [
        (functools.partial(grpo, group_size=4), (r,), {}),
        (functools.partial(grpo, group_size=4, normalize_std=False), (r,), {}),
        (functools.partial(rloo, group_size=4), (r,), {}),
        (reinforce_pp, (x, mask), {}),
        (functools.partial(reinforce_pp_baseline, group_size=2), (x, mask), {}),
        (ppo_policy_loss, (x, y, z, mask), {}),
        (functools.partial(ppo_policy_loss, clip_high=0.28, dual_clip=3.0, agg="seq-mean-token-sum-norm"), (x, y, z, mask), {}),
        (functools.partial(decoupled_ppo_loss, behav_weight_cap=5.0), (x, y, w, z, mask), {}),
        (functools.partial(value_loss, clip=0.2, huber_delta=1.0), (x, y, z, mask), {}),
        (functools.partial(entropy_from_logits), (rng.normal(size=(B, L, 7)), mask), {}),
        (functools.partial(informative_groups, group_size=4), (r,), {}),
    ]
    cases += [(functools.partial(aggregate, mode=m), (x, mask), {}) for m in AGG_MODES]
    cases += [(functools.partial(kl_penalty, kind=k), (x, y), {}) for k in ["k1", "abs", "k2", "k3"]]
    for fn, args, kw in cases:
        eager = fn(*args, **kw)
        jitted = jax.jit(fn)(*args, **kw)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5), eager, jitted)
    # gae jits with static gamma/lam.
    from rlinf_jax.algos import gae

    jax.jit(gae, static_argnums=(4, 5))(x, y, np.zeros((B, L)), np.zeros(L), 0.99, 0.95)


def test_gradients_are_finite_with_garbage_padding():
    rng = np.random.default_rng(0)
    lp, old, adv = rng.normal(size=(2, 4)), rng.normal(size=(2, 4)), rng.normal(size=(2, 4))
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 0]], np.float32)
    old[mask == 0] = -1e4
    g = jax.grad(lambda p: ppo_policy_loss(p, old, adv, mask, dual_clip=3.0)[0])(lp.astype(np.float32))
    assert np.all(np.isfinite(np.asarray(g)))
    assert np.all(np.asarray(g)[mask == 0] == 0)


def test_grpo_dynamic_hand_example():
    from rlinf_jax.algos import grpo_dynamic, turn_token_advantages

    # One prompt, two episodes: episode 0 has 2 turns (rewards 1, 1), episode 1 has 1 turn (reward 0).
    r = np.array([[1.0, 1.0], [0.0, 0.0]])
    v = np.array([[True, True], [True, False]])
    # trajectory: episode rewards 1, 0 -> mean 0.5, unbiased std sqrt(0.5) -> +-0.5/0.7071
    traj = np.asarray(grpo_dynamic(r, v, 2, "trajectory"))
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    np.testing.assert_allclose(traj, [[a, a], [-a, 0.0]], rtol=1e-6)
    # turn: values 1, 1, 0 -> mean 2/3, unbiased std sqrt((1/9 + 1/9 + 4/9) / 2) = sqrt(1/3)
    turn = np.asarray(grpo_dynamic(r, v, 2, "turn"))
    s = math.sqrt(1 / 3) + 1e-6
    np.testing.assert_allclose(turn, [[(1 / 3) / s, (1 / 3) / s], [(-2 / 3) / s, 0.0]], rtol=1e-6)
    # Equal rewards in a group: exact zeros.
    assert not np.asarray(grpo_dynamic(np.ones((2, 2)), np.ones((2, 2), bool), 2, "turn")).any()
    # Spread over tokens: model tokens of each turn get the turn's value, observations and padding 0.
    turn_ids = np.array([[0, 0, 0, 1, 1, -1], [0, 0, -1, -1, -1, -1]])
    loss = np.array([[1, 1, 0, 1, 1, 0], [1, 1, 0, 0, 0, 0]])
    tok = np.asarray(turn_token_advantages(jnp.asarray(turn), turn_ids, loss))
    np.testing.assert_allclose(tok[0], [turn[0, 0], turn[0, 0], 0, turn[0, 1], turn[0, 1], 0], rtol=1e-6)
    np.testing.assert_allclose(tok[1], [turn[1, 0], turn[1, 0], 0, 0, 0, 0], rtol=1e-6)
