"""Policy, value, KL and entropy terms as pure functions of arrays with optional masks.

Conventions: ``logp`` / ``old_logp`` are log pi(a|s) of the taken actions (tokens);
``advantages`` are already computed (and normalised, if wanted) by the caller. Sequence
data is ``[B, L]``; a ``mask`` of ``None`` means every position is valid. Masked-out
positions never influence a result: they are replaced by 0 (``jnp.where``), not
multiplied, so even inf/NaN there cannot leak in. Mode/kind strings are static Python
values (resolved at trace time), so everything jits.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from rlinf_jax.errors import BadInput


def _mask_like(x, mask):
    if mask is None:
        return jnp.ones(jnp.shape(x), jnp.float32)
    return jnp.broadcast_to(jnp.asarray(mask, jnp.float32), jnp.shape(x))


def _masked(x, m):
    """x * m with masked-out positions forced to exactly 0 (even where x is inf/NaN)."""
    return jnp.where(m != 0, x * m, 0.0)


def _safe_div(num, den):
    ok = den != 0
    return jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)


# ------------------------------------------------------------------ aggregation modes

AGGREGATIONS: dict[str, Callable] = {}


def _register_agg(name):
    def wrap(fn):
        AGGREGATIONS[name] = fn
        return fn

    return wrap


@_register_agg("token-mean")
def _token_mean(x, m, max_len):
    return _safe_div(jnp.sum(_masked(x, m)), jnp.sum(m))


def _seq_rows(x, m):
    if x.ndim != 2:
        raise BadInput(f"sequence aggregation needs [B, L] inputs, got shape {x.shape}")
    return jnp.sum(_masked(x, m), axis=-1), jnp.sum(m, axis=-1)


@_register_agg("seq-mean-token-sum")
def _seq_mean_token_sum(x, m, max_len):
    sums, _ = _seq_rows(x, m)
    return jnp.mean(sums)


@_register_agg("seq-mean-token-mean")
def _seq_mean_token_mean(x, m, max_len):
    sums, counts = _seq_rows(x, m)
    nonempty = counts > 0
    per_seq = _safe_div(sums, counts)
    # The mean runs over sequences with at least one valid token (an empty one has no mean).
    return _safe_div(jnp.sum(jnp.where(nonempty, per_seq, 0.0)), jnp.sum(nonempty))


@_register_agg("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(x, m, max_len):
    sums, _ = _seq_rows(x, m)
    B, L = x.shape
    return jnp.sum(sums) / (B * (L if max_len is None else max_len))


def aggregate(x, mask=None, mode="token-mean", max_len=None):
    """Reduce a per-token loss to a scalar.

    ``token-mean``: sum(x*m) / sum(m);  ``seq-mean-token-sum``: mean_b sum_t x*m;
    ``seq-mean-token-mean``: mean over non-empty sequences of sum_t x*m / sum_t m;
    ``seq-mean-token-sum-norm``: sum(x*m) / (B * max_len), max_len defaults to L
    (Dr. GRPO). An all-zero mask gives 0, never NaN. ``token-mean`` accepts any shape;
    the ``seq-*`` modes need ``[B, L]``.
    """
    if mode not in AGGREGATIONS:
        raise BadInput(f"algorithm.lm.loss_agg={mode!r} is not a known aggregation; choose one of {sorted(AGGREGATIONS)}")
    x = jnp.asarray(x, jnp.float32)
    return AGGREGATIONS[mode](x, _mask_like(x, mask), max_len)


# ------------------------------------------------------------------ policy losses


# |log ratio| beyond this is clamped before exp, as veRL and OpenRLHF do: a token whose
# probability moved by e^20 would otherwise give an exp-sized loss and gradient.
LOG_RATIO_CLAMP = 20.0


def _clipped_surrogate(log_ratio, advantages, clip_low, clip_high, dual_clip):
    """``(ratio, per-token loss, clipped)``; ``clipped`` marks the tokens where the clipped
    branch is the one taken (the peers' ``clip_fraction`` counts these)."""
    ratio = jnp.exp(jnp.clip(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    unclipped = -advantages * ratio
    clipped_loss = -advantages * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg = jnp.maximum(unclipped, clipped_loss)
    if dual_clip is not None:
        # Dual clip (Ye et al., 2020): caps the loss at c*|A|; for A >= 0 pg <= 0 so it never binds.
        pg = jnp.minimum(pg, dual_clip * jnp.abs(advantages))
    return ratio, pg, clipped_loss > unclipped


def ppo_policy_loss(
    logp, old_logp, advantages, mask=None, clip_low=0.2, clip_high=0.2, dual_clip=None, agg="token-mean"
):
    """PPO clipped surrogate (Schulman et al., 2017), with DAPO's clip-higher and dual clip.

    ratio = exp(logp - old_logp); per token
    l = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high)); with ``dual_clip``
    = c > 1, l = min(l, c * |A|) (binds only where A < 0). The loss is ``aggregate(l, mask,
    agg)``; ``log ratio`` is clamped to [-20, 20] before exp (veRL, OpenRLHF). Returns
    ``(loss, metrics)``; metrics (token-mean over the mask, whatever ``agg``) as veRL,
    RLinf and OpenRLHF define them: ``clip_fraction`` = share of tokens where the clipped
    term is the one taken (``-A * clip(ratio) > -A * ratio``); ``approx_kl`` = mean of
    ``old_logp - logp`` (the k1 estimator of KL(old || new), veRL's ``ppo_kl``);
    ``dual_clip_fraction`` = share where the dual clip binds.
    """
    adv = jnp.asarray(advantages, jnp.float32)
    m = _mask_like(adv, mask)
    valid = m != 0
    log_ratio = jnp.where(valid, jnp.asarray(logp, jnp.float32) - jnp.asarray(old_logp, jnp.float32), 0.0)
    adv = jnp.where(valid, adv, 0.0)
    ratio, pg, clipped = _clipped_surrogate(log_ratio, adv, clip_low, clip_high, dual_clip)
    loss = aggregate(pg, m, agg)
    metrics = {
        "clip_fraction": aggregate(clipped.astype(jnp.float32), m),
        "approx_kl": aggregate(-jnp.clip(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), m),
    }
    if dual_clip is not None:
        _, single, _ = _clipped_surrogate(log_ratio, adv, clip_low, clip_high, None)
        binds = single > dual_clip * jnp.abs(adv)
        metrics["dual_clip_fraction"] = aggregate(binds.astype(jnp.float32), m)
    return loss, metrics


def dual_clip_ppo_policy_loss(
    logp, old_logp, advantages, mask=None, clip_low=0.2, clip_high=0.2, dual_clip=3.0, agg="token-mean"
):
    """``ppo_policy_loss`` with the dual clip on by default (c = 3, Ye et al., 2020)."""
    return ppo_policy_loss(logp, old_logp, advantages, mask, clip_low, clip_high, dual_clip, agg)


def decoupled_ppo_loss(
    logp,
    prox_logp,
    behav_logp,
    advantages,
    mask=None,
    clip_low=0.2,
    clip_high=0.2,
    behav_weight_cap=None,
    dual_clip=None,
    agg="token-mean",
):
    """Decoupled PPO for asynchronous RL (Hilton et al., 2022; AReaL, Fu et al., 2025).

    Three policies: the one being trained (``logp``), the proximal policy pi_prox (the
    parameters at the start of this update, ``prox_logp``) and the behaviour policy that
    generated the tokens, possibly several versions stale (``behav_logp``).
    ratio = exp(logp - prox_logp) is clipped as in PPO (``clip_low``/``clip_high``,
    optional ``dual_clip``); each token's surrogate is weighted by
    w = exp(prox_logp - behav_logp) (a constant: no gradient). With ``behav_weight_cap``,
    tokens with w > cap get weight 0 but stay in the denominator of the aggregation (as in
    AReaL, which divides by the original mask count). Returns ``(loss, metrics)`` with
    ``clip_fraction``, ``approx_kl`` (train vs proximal), ``behav_weight_mean`` and
    ``behav_masked_fraction`` (share of valid tokens dropped by the cap); the metrics are
    defined as in `ppo_policy_loss`.
    """
    adv = jnp.asarray(advantages, jnp.float32)
    m = _mask_like(adv, mask)
    valid = m != 0
    prox = jnp.asarray(prox_logp, jnp.float32)
    log_ratio = jnp.where(valid, jnp.asarray(logp, jnp.float32) - prox, 0.0)
    log_w = jnp.where(valid, prox - jnp.asarray(behav_logp, jnp.float32), 0.0)
    w = jax.lax.stop_gradient(jnp.exp(log_w))
    adv = jnp.where(valid, adv, 0.0)
    ratio, pg, clipped = _clipped_surrogate(log_ratio, adv, clip_low, clip_high, dual_clip)
    keep = jnp.ones_like(w, dtype=bool) if behav_weight_cap is None else w <= behav_weight_cap
    loss = aggregate(jnp.where(keep, pg * w, 0.0), m, agg)
    metrics = {
        "clip_fraction": aggregate(clipped.astype(jnp.float32), m),
        "approx_kl": aggregate(-jnp.clip(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), m),
        "behav_weight_mean": aggregate(w, m),
        "behav_masked_fraction": aggregate((~keep).astype(jnp.float32), m),
    }
    return loss, metrics


# ------------------------------------------------------------------ value loss


def value_loss(values, old_values, returns, mask=None, clip=None, huber_delta=None, agg="token-mean"):
    """Critic loss: per element f(returns - values), aggregated with ``agg``.

    f(e) = 0.5 e^2, or the Huber loss with ``huber_delta`` d (0.5 e^2 for |e| <= d, else
    d (|e| - d/2)). With ``clip``: max(f(R - V), f(R - V_clip)), V_clip = old_values +
    clip(V - old_values, -clip, clip) (PPO2). ``old_values`` is only read with ``clip``
    and may be None otherwise.
    """
    values = jnp.asarray(values, jnp.float32)
    returns = jnp.asarray(returns, jnp.float32)
    m = _mask_like(values, mask)

    def f(e):
        e = jnp.where(m != 0, e, 0.0)
        if huber_delta is None:
            return 0.5 * jnp.square(e)
        a = jnp.abs(e)
        return jnp.where(a <= huber_delta, 0.5 * jnp.square(e), huber_delta * (a - 0.5 * huber_delta))

    err = f(returns - values)
    if clip is not None:
        if old_values is None:
            raise ValueError("value_loss: clip given without old_values")
        old_values = jnp.asarray(old_values, jnp.float32)
        v_clipped = old_values + jnp.clip(values - old_values, -clip, clip)
        err = jnp.maximum(err, f(returns - v_clipped))
    return aggregate(err, m, agg)


# ------------------------------------------------------------------ KL and entropy

KL_KINDS: dict[str, Callable] = {}


def _register_kl(*names):
    def wrap(fn):
        for n in names:
            KL_KINDS[n] = fn
        return fn

    return wrap


@_register_kl("k1", "kl")
def _kl_k1(d):
    return d


@_register_kl("abs")
def _kl_abs(d):
    return jnp.abs(d)


@_register_kl("k2", "mse")
def _kl_k2(d):
    return 0.5 * jnp.square(d)


@_register_kl("k3", "low_var_kl")
def _kl_k3(d):
    # Clamped as veRL's and RLinf's low_var_kl: -d to [-20, 20] before exp, the result to
    # [-10, 10], so a token far off the reference adds a bounded penalty, not an exp one.
    neg = jnp.clip(-d, -20.0, 20.0)
    return jnp.clip(jnp.exp(neg) - neg - 1.0, -10.0, 10.0)


def kl_penalty(logp, ref_logp, kind="k1"):
    """Per-token estimate of KL(pi || pi_ref) from sampled log-probs (Schulman, 2020).

    d = logp - ref_logp. ``k1``/``kl``: d; ``abs``: |d|; ``k2``/``mse``: 0.5 d^2;
    ``k3``/``low_var_kl``: exp(-d) + d - 1 (unbiased, >= 0), clamped as veRL and RLinf
    clamp it (-d to [-20, 20], the result to [-10, 10]); the others unclamped. Aggregate the
    result with ``aggregate`` for a loss term, or subtract coef * it from token rewards.
    """
    if kind not in KL_KINDS:
        raise BadInput(f"algorithm.lm.kl_type={kind!r} is not a known KL estimator; choose one of {sorted(KL_KINDS)}")
    d = jnp.asarray(logp, jnp.float32) - jnp.asarray(ref_logp, jnp.float32)
    return KL_KINDS[kind](d)


def entropy_from_logits(logits, mask=None):
    """Per-position entropy H = -sum_v p_v log p_v of softmax(logits) over the last axis.

    ``logits`` ``[..., V]`` gives ``[...]`` (e.g. ``[B, L]``); masked-out positions are 0.
    Vocabulary entries at -inf (p = 0) contribute 0. Reduce with ``aggregate``.
    """
    logits = jnp.asarray(logits, jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    p = jnp.exp(logp)
    h = -jnp.sum(jnp.where(p > 0, p * logp, 0.0), axis=-1)
    if mask is None:
        return h
    return jnp.where(jnp.asarray(mask) != 0, h, 0.0)


def entropy_bonus(entropy, mask=None, agg="token-mean"):
    """Aggregated entropy (token-mean by default); the caller subtracts coef * this from the loss."""
    return aggregate(entropy, mask, agg)
