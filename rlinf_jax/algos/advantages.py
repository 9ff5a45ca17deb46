"""Advantage estimators: pure functions on time-major arrays.

Shapes: rewards, values, dones, truncations, final_values are ``[T, B]``; last_value
is ``[B]``. ``values[t]`` is V(s_t); ``dones[t] = 1`` when the episode ended after step t
for any reason, and ``truncations[t] = 1`` when that end was a time limit, in which case
V(final observation) (``final_values[t]``) is bootstrapped instead of 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def gae(rewards, values, dones, last_value, gamma, lam, truncations=None, final_values=None):
    """Generalised advantage estimation (Schulman et al., 2016) with truncation bootstrap.

    next_value_t = V(s_{t+1}) (``last_value`` at t = T-1) when the episode goes on,
    V(final obs) when it was truncated, 0 when it terminated.
    delta_t = r_t + gamma * next_value_t - V(s_t)
    A_t = delta_t + gamma * lam * (1 - dones[t]) * A_{t+1};  returns = A + V.
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    values = jnp.asarray(values, jnp.float32)
    dones = jnp.asarray(dones, jnp.float32)
    last_value = jnp.asarray(last_value, jnp.float32)
    next_values = jnp.concatenate([values[1:], last_value[None]], axis=0)
    # Value of what follows step t: the next state, or nothing after an ending.
    bootstrap = next_values * (1.0 - dones)
    if truncations is not None:
        if final_values is None:
            raise ValueError("gae: truncations given without final_values")
        truncations = jnp.asarray(truncations, jnp.float32)
        bootstrap = bootstrap + truncations * jnp.asarray(final_values, jnp.float32)
    deltas = rewards + gamma * bootstrap - values

    def backward(carry, x):
        delta, done = x
        adv = delta + gamma * lam * (1.0 - done) * carry
        return adv, adv

    _, advantages = jax.lax.scan(
        backward, jnp.zeros_like(last_value), (deltas, dones), reverse=True
    )
    return advantages, advantages + values


# --------------------------------------------------------------------------------------
# Outcome-reward estimators on groups of sequences (GRPO, Dr. GRPO, RLOO, REINFORCE++).
# ``rewards`` is ``[N]`` with groups contiguous: ``rewards.reshape(-1, group_size)``.
# Sequence data is ``[B, L]`` with a 0/1 ``mask`` over valid tokens.
# --------------------------------------------------------------------------------------


def reward_groups(rewards, group_size):
    """``rewards [N]`` as ``[N / group_size, group_size]``: the samples of one prompt per row."""
    rewards = jnp.asarray(rewards, jnp.float32)
    group_size = int(group_size)
    if group_size < 1 or rewards.ndim != 1 or rewards.shape[0] % group_size:
        raise ValueError(
            f"rewards of shape {rewards.shape} do not split into groups of {group_size}"
        )
    return rewards.reshape(-1, group_size)


def grpo(rewards, group_size, eps=1e-6, normalize_std=True):
    """GRPO outcome advantages (Shao et al., 2024, DeepSeekMath), one per sequence.

    A_i = (r_i - mean_g(r)) / (std_g(r) + eps), std unbiased (ddof=1).
    ``normalize_std=False`` gives A_i = r_i - mean_g(r) (Dr. GRPO, Liu et al., 2025).
    A group whose rewards are all equal (including group_size=1) gets exact zeros.
    Returns ``[N]``.
    """
    g = reward_groups(rewards, group_size)
    n = g.shape[1]
    mean = jnp.mean(g, axis=1, keepdims=True)
    centred = g - mean
    all_equal = jnp.max(g, axis=1, keepdims=True) == jnp.min(g, axis=1, keepdims=True)
    if normalize_std:
        if n > 1:
            std = jnp.sqrt(jnp.sum(jnp.square(centred), axis=1, keepdims=True) / (n - 1))
        else:
            std = jnp.zeros_like(mean)
        adv = centred / (std + eps)
    else:
        adv = centred
    return jnp.where(all_equal, 0.0, adv).reshape(-1)


def dr_grpo(rewards, group_size, eps=1e-6):
    """Dr. GRPO (Liu et al., 2025): ``grpo`` without the std division, A_i = r_i - mean_g(r)."""
    return grpo(rewards, group_size, eps=eps, normalize_std=False)


def rloo(rewards, group_size):
    """REINFORCE leave-one-out (Ahmadian et al., 2024): A_i = r_i - mean_{j != i} r_j.

    Needs group_size >= 2. Returns ``[N]``.
    """
    g = reward_groups(rewards, group_size)
    n = g.shape[1]
    if n < 2:
        raise ValueError("rloo needs group_size >= 2 (a leave-one-out baseline)")
    total = jnp.sum(g, axis=1, keepdims=True)
    return (g - (total - g) / (n - 1)).reshape(-1)


def _reward_to_go(token_rewards, mask, gamma):
    """G_t = sum over valid k >= t of gamma^(#valid tokens in [t, k)) r_k; 0 at padding.

    The discount counts valid tokens only, so a padding gap inside a sequence neither
    discounts nor contributes.
    """
    r = jnp.asarray(token_rewards, jnp.float32)
    m = jnp.asarray(mask, jnp.float32)
    r = jnp.where(m > 0, r, 0.0)

    def step(carry, x):
        rt, mt = x
        g = jnp.where(mt > 0, rt + gamma * carry, carry)
        return g, g

    _, out = jax.lax.scan(step, jnp.zeros(r.shape[0], jnp.float32), (r.T, m.T), reverse=True)
    return jnp.where(m > 0, out.T, 0.0)


def whiten(x, mask, eps=1e-8, floor: bool = False):
    """Batch whitening over the valid positions; padding gets 0.

    Default, as veRL's ``masked_whiten`` (its GAE advantages): ``(x - mean) /
    sqrt(var_unbiased + eps)``. With ``floor``, as OpenRLHF's and RLinf's REINFORCE++:
    ``(x - mean) / sqrt(max(var_population, eps))``.
    """
    m = jnp.asarray(mask, jnp.float32)
    valid = m > 0
    n = jnp.sum(valid)
    count = jnp.maximum(n, 1)
    x = jnp.where(valid, x, 0.0)
    mean = jnp.sum(x) / count
    squares = jnp.sum(jnp.where(valid, jnp.square(x - mean), 0.0))
    if floor:
        scale = jnp.sqrt(jnp.maximum(squares / count, eps))
    else:
        scale = jnp.sqrt(squares / jnp.maximum(n - 1, 1) + eps)
    return jnp.where(valid, (x - mean) / scale, 0.0)


def reinforce_pp(token_rewards, mask, gamma=1.0, eps=1e-8):
    """REINFORCE++ (Hu, 2025): discounted reward-to-go, whitened over the batch's tokens.

    G_t = per-sequence discounted reward-to-go over masked tokens (``[B, L]``);
    A = (G - mean) / sqrt(max(var, eps)), mean and population variance over all masked
    tokens of the batch (OpenRLHF's and RLinf's placement of eps). Padding positions get 0.
    """
    return whiten(_reward_to_go(token_rewards, mask, gamma), mask, eps, floor=True)


def reinforce_pp_baseline(token_rewards, mask, group_size, gamma=1.0, eps=1e-8, token_penalty=None):
    """REINFORCE++-baseline (OpenRLHF; RLinf's ``reinpp`` with ``use_reinpp_baseline``):
    subtract the group mean of the outcome rewards, then add per-token penalties, then
    ``reinforce_pp``.

    ``token_rewards`` ``[B, L]`` hold the outcome rewards (typically on the last valid
    token); sequence reward s_i = sum_t r_{i,t} m_{i,t}; b_i = mean of s over i's group
    (rows contiguous, ``group_size`` per group) is subtracted from the reward of the last
    valid token of sequence i, so with gamma = 1 every G_t drops by exactly b_i.
    ``token_penalty`` ``[B, L]`` (e.g. ``-kl_coef * KL`` per token) is added after the
    baseline: the baseline is the outcomes' alone, as in both peers.
    """
    r = jnp.asarray(token_rewards, jnp.float32)
    m = jnp.asarray(mask, jnp.float32)
    r = jnp.where(m > 0, r, 0.0)
    seq = jnp.sum(r, axis=1)
    baseline = jnp.repeat(jnp.mean(reward_groups(seq, group_size), axis=1), int(group_size))
    L = r.shape[1]
    valid = m > 0
    last = L - 1 - jnp.argmax(valid[:, ::-1], axis=1)
    onehot = (jnp.arange(L)[None, :] == last[:, None]) & valid
    r = r - onehot * baseline[:, None]
    if token_penalty is not None:
        r = r + jnp.where(valid, jnp.asarray(token_penalty, jnp.float32), 0.0)
    return reinforce_pp(r, m, gamma=gamma, eps=eps)


def grpo_dynamic(turn_rewards, turn_valid, group_size, mode="turn", eps=1e-6):
    """Multi-turn GRPO (RLinf's ``grpo_dynamic``): one advantage per turn, ``[B, T]``.

    ``turn_rewards [B, T]`` (turn t of episode b; RLinf gives every turn its episode's
    reward), ``turn_valid [B, T]`` (the episode has that turn); episodes come in groups of
    ``group_size`` consecutive rows (one prompt's samples).

    - ``"trajectory"``: an episode's reward is the mean of its turns' rewards; GRPO over the
      group's episodes (unbiased std); every turn of an episode gets its episode's value.
    - ``"turn"``: GRPO over all the turns of the group's episodes together, so an episode
      with more turns weighs more in the group's mean and std.

    A group whose values are all equal (or that has a single value) gets exact zeros, as
    `grpo` does. Turns that do not exist get 0.
    """
    if mode not in ("trajectory", "turn"):
        raise ValueError(f"grpo_dynamic mode {mode!r} must be 'trajectory' or 'turn'")
    r = jnp.asarray(turn_rewards, jnp.float32)
    v = jnp.asarray(turn_valid, bool)
    B, T = r.shape
    if B % int(group_size):
        raise ValueError(f"{B} episodes do not split into groups of {group_size}")
    if mode == "trajectory":
        n = jnp.maximum(jnp.sum(v, axis=1), 1)
        per_episode = jnp.sum(jnp.where(v, r, 0.0), axis=1) / n
        return jnp.where(v, grpo(per_episode, group_size, eps)[:, None], 0.0)
    g = r.reshape(-1, group_size * T)
    gv = v.reshape(-1, group_size * T)
    n = jnp.sum(gv, axis=1, keepdims=True)
    mean = jnp.sum(jnp.where(gv, g, 0.0), axis=1, keepdims=True) / jnp.maximum(n, 1)
    centred = jnp.where(gv, g - mean, 0.0)
    std = jnp.sqrt(jnp.sum(jnp.square(centred), axis=1, keepdims=True) / jnp.maximum(n - 1, 1))
    big, small = jnp.max(jnp.where(gv, g, -jnp.inf), axis=1, keepdims=True), jnp.min(jnp.where(gv, g, jnp.inf), axis=1, keepdims=True)
    adv = jnp.where((big == small) | (n < 2), 0.0, centred / (std + eps))
    return jnp.where(gv, adv, 0.0).reshape(B, T)


def turn_token_advantages(turn_advantages, turn_ids, loss_mask):
    """Per-turn advantages ``[B, T]`` spread over each turn's tokens ``[B, W]`` (turn ids
    ``-1`` on padding), zero where ``loss_mask`` is 0 (prompt, observations, padding)."""
    idx = jnp.clip(turn_ids, 0, turn_advantages.shape[1] - 1)
    adv = jnp.take_along_axis(turn_advantages, idx, axis=1)
    return jnp.where((loss_mask > 0) & (turn_ids >= 0), adv, 0.0)
