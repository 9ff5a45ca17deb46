"""The reasoning RL flow's maths against independent references: log-probs of the
[prompt | response] layout, advantages, the PPO update with gradient accumulation, dynamic
sampling's batch assembly, pass@k."""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlinf_jax.config import load_config
from rlinf_jax.policies.lm.logprobs import policy_logprobs
from rlinf_jax.rollout.scoring import pass_at_k
from rlinf_jax.tasks.reasoning import update as rl
from rlinf_jax.tasks.reasoning.trainer import ReasoningTrainer
from tests.test_sft import TINY_LM


def rl_config(tmp_path, *extra):
    return load_config("grpo_math", [
        *TINY_LM,
        f"runner.output_dir={tmp_path}",
        "runner.experiment_name=r",
        "sft.warm_start_steps=0",
        "data.rollout_batch_size=4",
        "algorithm.lm.group_size=4",
        "actor.global_batch_size=16",
        "actor.micro_batch_size=16",
        *extra,
    ])


def trainer(tmp_path, *extra):
    return ReasoningTrainer(rl_config(tmp_path, *extra))


def log_softmax_np(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.mark.slow
def test_policy_logprobs_equal_each_row_alone_and_the_samplers(tmp_path):
    t = trainer(tmp_path)
    batch, _ = t.collector.batch(jax.random.PRNGKey(3))
    model = nnx.merge(t.lm.graphdef, t._init_params["policy"])
    logp, entropy = policy_logprobs(model, {k: jnp.asarray(v) for k, v in batch.items()})
    logp, entropy = np.asarray(logp), np.asarray(entropy)
    for r in range(batch["tokens"].shape[0]):
        prompt = batch["prompt_ids"][r][batch["prompt_mask"][r] > 0]
        resp = batch["tokens"][r][batch["response_mask"][r] > 0]
        lp = log_softmax_np(np.asarray(model(jnp.asarray(np.concatenate([prompt, resp])[None])))[0])
        for j, tok in enumerate(resp):
            ref = lp[len(prompt) + j - 1]
            assert logp[r, j] == pytest.approx(ref[tok], abs=2e-4)
            assert entropy[r, j] == pytest.approx(-(np.exp(ref) * ref).sum(), abs=2e-4)
    # The sampler's log-probs (temperature 1) are the trainer's: on-policy means ratio 1.
    m = batch["response_mask"] > 0
    np.testing.assert_allclose(batch["sampler_logp"][m], logp[m], atol=2e-4)


@pytest.mark.slow
def test_shared_prompts_give_the_per_row_logprobs_and_gradients(tmp_path):
    # group_size 4, one mini-batch: the update runs each prompt once per group.
    t = trainer(tmp_path)
    assert t.update_spec.prompt_group == 4
    batch, _ = t.collector.batch(jax.random.PRNGKey(3))
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    np.testing.assert_array_equal(batch["prompt_ids"][::4].repeat(4, axis=0), batch["prompt_ids"])
    graphdef, params = t.lm.graphdef, t._init_params["policy"]
    m = batch["response_mask"]

    def loss(p, group):
        logp, entropy = policy_logprobs(nnx.merge(graphdef, p), batch, 1.0, group)
        return jnp.sum((logp + 0.1 * entropy) * m) / jnp.sum(m), (logp, entropy)

    (_, (lp1, e1)), g1 = jax.value_and_grad(loss, has_aux=True)(params, 1)
    (_, (lp4, e4)), g4 = jax.value_and_grad(loss, has_aux=True)(params, 4)
    np.testing.assert_allclose(np.asarray(lp4)[m > 0], np.asarray(lp1)[m > 0], atol=2e-6)
    np.testing.assert_allclose(np.asarray(e4)[m > 0], np.asarray(e1)[m > 0], atol=2e-6)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g4)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-4 * float(jnp.max(jnp.abs(a))))
    # Shuffled mini-batches break the groups apart: every row then runs its own prompt.
    assert trainer(tmp_path, "actor.global_batch_size=8").update_spec.prompt_group == 1


def _fixed_batch(t, seed=0):
    """A rollout batch with rewards set by hand (two levels per group, one all-equal group)."""
    batch, _ = t.collector.batch(jax.random.PRNGKey(seed))
    rng = np.random.default_rng(seed)
    rewards = rng.integers(0, 2, batch["rewards"].shape).astype(np.float32)
    rewards[:4] = 1.0  # group 0: all correct -> zero advantage
    batch["rewards"] = rewards
    return batch


def test_grpo_advantages_and_on_policy_loss_match_hand_formulas(tmp_path):
    t = trainer(tmp_path)
    batch = _fixed_batch(t)
    out = rl.advantages(t.update_spec, t._init_params, {k: jnp.asarray(v) for k, v in batch.items()})
    m = batch["response_mask"]
    for g in range(4):
        r = batch["rewards"][4 * g : 4 * g + 4]
        expect = np.zeros(4) if r.max() == r.min() else (r - r.mean()) / (r.std(ddof=1) + 1e-6)
        for i in range(4):
            row = 4 * g + i
            np.testing.assert_allclose(np.asarray(out["advantages"])[row][m[row] > 0], expect[i], rtol=1e-5, atol=1e-6)
    # One epoch, one mini-batch: ratio 1, so the token-mean loss is -sum(A m) / sum(m).
    ts = t.init()
    _, metrics = rl.update(t.update_spec, ts, {k: jnp.asarray(v) for k, v in batch.items()}, jax.random.PRNGKey(0))
    adv = np.asarray(out["advantages"])
    assert float(metrics["train/policy_loss"]) == pytest.approx(-(adv * m).sum() / m.sum(), abs=1e-6)
    assert float(metrics["train/clip_fraction"]) == 0.0 and abs(float(metrics["train/approx_kl"])) < 1e-7


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batches_accumulate_to_the_whole_mini_batch(tmp_path, agg):
    extra = (f"algorithm.lm.loss_agg={agg}", "algorithm.update_epochs=2", "actor.global_batch_size=8")
    whole = trainer(tmp_path, *extra, "actor.micro_batch_size=8")
    split = trainer(tmp_path, *extra, "actor.micro_batch_size=2")
    batch = {k: jnp.asarray(v) for k, v in _fixed_batch(whole, 1).items()}
    a, ma = rl.update(whole.update_spec, whole.init(), batch, jax.random.PRNGKey(5))
    b, mb = rl.update(split.update_spec, split.init(), batch, jax.random.PRNGKey(5))
    for k in ("train/policy_loss", "train/clip_fraction", "train/approx_kl", "train/entropy"):
        assert float(ma[k]) == pytest.approx(float(mb[k]), rel=1e-4, abs=1e-6), k
    assert float(ma["train/approx_kl"]) > 0  # the later mini-batches and epoch ran off-policy
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-6)


def test_gae_on_the_value_model_matches_a_naive_loop(tmp_path):
    t = trainer(tmp_path, "algorithm.adv_type=gae", "algorithm.gamma=0.9", "algorithm.gae_lambda=0.8",
                "algorithm.normalize_advantages=false")
    batch = _fixed_batch(t, 2)
    params = t._init_params
    # Give the zero-initialised head some weights so the values are not all 0.
    params["value"]["head"]["kernel"] = params["value"]["head"]["kernel"].replace(
        jnp.asarray(np.random.default_rng(0).normal(size=(32, 1)), jnp.float32) * 0.1
    )
    out = rl.advantages(t.update_spec, params, {k: jnp.asarray(v) for k, v in batch.items()})
    values = np.asarray(out["old_values"])
    m = batch["response_mask"]
    for r in range(m.shape[0]):
        L = int(m[r].sum())
        adv = np.zeros(L)
        nxt = 0.0
        for j in reversed(range(L)):
            reward = batch["rewards"][r] if j == L - 1 else 0.0
            next_v = values[r, j + 1] if j + 1 < L else 0.0
            delta = reward + 0.9 * next_v - values[r, j]
            nxt = delta + 0.9 * 0.8 * (nxt if j + 1 < L else 0.0)
            adv[j] = nxt
        np.testing.assert_allclose(np.asarray(out["advantages"])[r, :L], adv, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(np.asarray(out["returns"])[r, :L], adv + values[r, :L], rtol=1e-4, atol=1e-5)


def test_dynamic_sampling_fills_the_batch_with_informative_groups(tmp_path):
    t = trainer(tmp_path, "algorithm.lm.dynamic_sampling=true", "algorithm.lm.max_resample=3")
    real = t.collector.round
    plans = iter([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 1, 1]])  # informative groups per round

    def fake_round(key):
        data = real(key)
        plan = next(plans)
        data["rewards"] = np.concatenate([[1, 0, 0, 0] if p else [1, 1, 1, 1] for p in plan]).astype(np.float32)
        data["tag"] = np.repeat(np.arange(4) + 10 * len(calls), 4)
        calls.append(plan)
        return data

    calls = []
    t.collector.round = fake_round
    batch, metrics = t.collector.batch(jax.random.PRNGKey(0))
    assert len(calls) == 2  # 3 informative groups, then 1 more from the second round
    groups = batch["rewards"].reshape(4, 4)
    assert (groups.max(1) != groups.min(1)).all()
    assert metrics["rollout/batch_filled"] == 1.0 and metrics["rollout/sampling_rounds"] == 2.0
    assert metrics["rollout/sampled_groups"] == 8.0
    assert t.loader.state_dict()["position"] == 8  # two batches of 4 prompts drawn


def test_pass_at_k_matches_enumeration():
    for n, c, k in itertools.product(range(1, 6), range(6), range(1, 6)):
        if c > n or k > n:
            continue
        draws = list(itertools.combinations(range(n), k))
        hit = sum(any(i < c for i in d) for d in draws) / len(draws)
        assert pass_at_k(n, c, k) == pytest.approx(hit), (n, c, k)
    assert math.isclose(pass_at_k(10, 3, 1), 0.3)
