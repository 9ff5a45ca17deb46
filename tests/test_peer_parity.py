"""Our RL maths against RLinf's own implementation (the `rlinf` package, installed without
its dependencies: its `rlinf.algorithms` needs only torch), on the same random inputs.

docs/algorithms.md lists every deliberate difference; these tests hold the rest equal.
"""

from __future__ import annotations

from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np
import pytest

from rlinf_jax.algos import grpo, ppo_policy_loss
from rlinf_jax.tasks.reasoning import update as rl

torch = pytest.importorskip("torch")
rlinf_adv = pytest.importorskip("rlinf.algorithms.advantages")
rlinf_losses = pytest.importorskip("rlinf.algorithms.losses")
rlinf_registry = pytest.importorskip("rlinf.algorithms.registry")

torch.set_num_threads(1)


def _responses(seed, groups=12, group_size=8, length=40):
    """Right-padded responses: a mask, log-probs under the policy and the reference (equal
    on padding), and outcome rewards."""
    rng = np.random.default_rng(seed)
    B = groups * group_size
    lengths = rng.integers(5, length + 1, size=B)
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.float32)
    logp = (-rng.exponential(1.0, size=(B, length))).astype(np.float32)
    ref = (logp + rng.normal(0, 0.3, size=(B, length))).astype(np.float32)
    ref = np.where(mask > 0, ref, logp)
    rewards = rng.integers(0, 2, size=B).astype(np.float32)
    return mask, logp, ref, rewards


def _flow_advantages(adv_type, mask, logp, ref, rewards, group_size, kl_coef, kl_type):
    """The reasoning flow's own advantage step (`tasks/reasoning/update.advantages`) on a
    batch whose behaviour log-probs are the sampler's (one epoch, one mini-batch)."""
    algorithm = SimpleNamespace(
        adv_type=adv_type, gamma=1.0, normalize_advantages=False,
        lm=SimpleNamespace(group_size=group_size, kl_coef=kl_coef, kl_type=kl_type, kl_in_reward=True),
    )
    u = rl.RLUpdate(None, None, None, None, None, algorithm, 1.0, len(rewards), len(rewards), 1, recompute_old=False)
    batch = {"response_mask": jnp.asarray(mask), "rewards": jnp.asarray(rewards), "sampler_logp": jnp.asarray(logp),
             "ref_logp": jnp.asarray(ref)}
    return np.asarray(rl.advantages(u, None, batch)["advantages"])


@pytest.mark.parametrize("kl_type, rlinf_kl", [("k3", "low_var_kl"), ("k1", "k1")])
def test_reinforce_pp_baseline_with_kl_in_the_rewards_matches_rlinf(kl_type, rlinf_kl):
    mask, logp, ref, rewards = _responses(0)
    ours = _flow_advantages("reinforce_pp_baseline", mask, logp, ref, rewards, 8, 0.05, kl_type)
    # RLinf's entry point for a reasoning batch, as its FSDP actor calls it. Its baseline
    # branch (use_reinpp_baseline=True) fails in 0.3.0 (the centred rewards lose the batch
    # dimension its scatter needs), so its first step, the group-mean subtraction of the
    # outcomes, is done here as that branch writes it; the KL, returns and whitening are its.
    centred = rewards.reshape(-1, 8) - rewards.reshape(-1, 8).mean(axis=1, keepdims=True)
    theirs, _ = rlinf_registry.calculate_adv_and_returns(
        task_type="reasoning", adv_type="reinpp", rewards=torch.tensor(centred.reshape(-1)),
        loss_mask=torch.tensor(mask > 0), group_size=8, kl_beta=0.05, kl_penalty_type=rlinf_kl,
        logprob=torch.tensor(logp), ref_logprob=torch.tensor(ref), use_reinpp_baseline=False,
    )
    theirs = theirs.numpy()
    assert theirs.shape == mask.shape
    valid = mask > 0
    np.testing.assert_allclose(ours[valid], theirs[valid], rtol=1e-4, atol=2e-5)


def test_grpo_matches_rlinf():
    rng = np.random.default_rng(1)
    rewards = rng.normal(size=96).astype(np.float32)
    theirs, _ = rlinf_adv.compute_grpo_advantages(torch.tensor(rewards), torch.ones(1, 96), 8)
    np.testing.assert_allclose(np.asarray(grpo(rewards, 8)), theirs.numpy()[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_ppo_loss_and_its_metrics_match_rlinf(dual_clip):
    rng = np.random.default_rng(2)
    shape = (16, 24)
    logp = rng.normal(0, 0.4, size=shape).astype(np.float32) - 1.0
    old = (logp + rng.normal(0, 0.3, size=shape)).astype(np.float32)
    adv = rng.normal(size=shape).astype(np.float32)
    mask = rng.random(shape) < 0.8
    loss, m = ppo_policy_loss(logp, old, adv, mask.astype(np.float32), 0.2, 0.28, dual_clip)
    t_loss, t_m = rlinf_losses.compute_ppo_actor_loss(
        torch.tensor(logp), torch.tensor(old), 0.2, 0.28, torch.tensor(adv), torch.tensor(mask), clip_ratio_c=dual_clip,
    )
    assert float(loss) == pytest.approx(float(t_loss), rel=1e-5, abs=1e-6)
    assert float(m["clip_fraction"]) == pytest.approx(float(t_m["actor/clip_fraction"]), abs=1e-6)
    assert float(m["approx_kl"]) == pytest.approx(float(t_m["actor/approx_kl"]), rel=1e-5, abs=1e-6)
