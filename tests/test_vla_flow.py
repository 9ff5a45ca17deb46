"""The VLA policy on the embodied flow: chunk log-probs against a per-slot reference,
bidirectional action slots, GRPO's group advantages against a naive loop, behaviour cloning,
and one PPO iteration giving the same numbers collocated and disaggregated."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlinf_jax.config import load_config
from rlinf_jax.envs import make_env
from rlinf_jax.errors import BadInput

# A VLA small enough to compile in seconds: 16 px images (4 patches), one-layer tower and
# backbone, 8 bins, chunks of 2 sub-steps, 4-sub-step episodes. TINY_VLA_MODEL is what an
# SFT run of it reads; TINY_VLA adds the RL run's settings.
TINY_VLA_MODEL = [
    "env.num_envs=4",
    "env.num_eval_envs=4",
    "env.image_size=16",
    "env.chunk_length=2",
    "env.episode_length=4",
    "actor.model.vla.patch_size=8",
    "actor.model.vla.vision_hidden_size=16",
    "actor.model.vla.vision_layers=1",
    "actor.model.vla.vision_heads=1",
    "actor.model.lm.hidden_size=32",
    "actor.model.lm.intermediate_size=64",
    "actor.model.lm.num_layers=1",
    "actor.model.lm.num_heads=2",
    "actor.model.lm.num_kv_heads=1",
    "actor.model.vla.n_bins=8",
    "sft.dagger_rounds=0",
    "runner.progress_bar=false",
]
TINY_VLA = [
    *TINY_VLA_MODEL,
    "algorithm.rollout_length=2",
    "algorithm.num_minibatches=2",
    "algorithm.update_epochs=1",
    "sft.warm_start_steps=0",
    "sft.critic_warmup_steps=0",
]


def _policy(*extra):
    from rlinf_jax.policies.embodied import embodied_policy

    cfg = load_config("ppo_vla_tabletop", [*TINY_VLA, *extra])
    env = make_env(cfg.env)
    policy = embodied_policy(cfg, env)
    return cfg, policy, policy.build(nnx.Rngs(0))


def _obs(batch=3, seed=0):
    from rlinf_jax.envs.tabletop import encode_instruction

    rng = np.random.default_rng(seed)
    words = ["put the red cube on the blue pad", "put the green ball on the yellow pad", "put the cube on the pad"]
    return {
        "image": jnp.asarray(rng.integers(0, 256, (batch, 16, 16, 3)), jnp.uint8),
        "tokens": jnp.asarray(np.stack([encode_instruction(words[i % 3]) for i in range(batch)])),
        "proprio": jnp.asarray(rng.normal(size=(batch, 4)), jnp.float32),
    }


def _log_softmax(x):
    x = np.asarray(x, np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.mark.slow
def test_chunk_logprob_entropy_and_actions_match_a_per_slot_reference():
    cfg, policy, model = _policy()
    obs = _obs()
    keys = jax.random.split(jax.random.PRNGKey(1), 3)
    action, bins, logprob = policy.act(model, obs, keys)
    logits, value = model(obs)
    assert logits.shape == (3, 2 * 7, 8) and value.shape == (3,)
    assert action.shape == (3, 2, 7) and bins.dtype == jnp.int32

    # Reference: every slot is its own categorical over the bins at the sampling
    # temperature; the chunk's log-prob is the sum over slots, its entropy likewise.
    assert policy.temperature == cfg.actor.model.vla.temperature
    lp = _log_softmax(np.asarray(logits, np.float64) / policy.temperature)
    b = np.asarray(bins)
    ref_logprob = np.array([sum(lp[i, s, b[i, s]] for s in range(14)) for i in range(3)])
    ref_entropy = -(np.exp(lp) * lp).sum(-1).sum(-1)
    np.testing.assert_allclose(np.asarray(logprob), ref_logprob, rtol=1e-5, atol=1e-5)
    again, entropy, value2 = policy.evaluate_actions(model, obs, bins, None)
    np.testing.assert_allclose(np.asarray(again), ref_logprob, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(entropy), ref_entropy, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(value2), np.asarray(value), rtol=1e-6)
    # The rollout records the value its acting pass computed: the same sample, the critic's value.
    *sampled, rollout_value = policy.act_with_value(model, obs, keys)
    for got, want in zip(sampled, (action, bins, logprob)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    np.testing.assert_allclose(np.asarray(rollout_value), np.asarray(policy.critic(model, obs)), rtol=1e-6)

    # Bin b of n is OpenVLA's token vocab_end - (n - b): centre of the (n-1-b)-th interval
    # of linspace(-1, 1, n), the two end bins sharing the end centres.
    edges = np.linspace(-1, 1, 8)
    centres = (edges[:-1] + edges[1:]) / 2
    expected = centres[np.clip(8 - b - 1, 0, 6)].reshape(3, 2, 7)
    np.testing.assert_allclose(np.asarray(action), expected, rtol=1e-6)
    greedy = policy.act_deterministic(model, obs)
    np.testing.assert_allclose(
        np.asarray(greedy), centres[np.clip(8 - np.argmax(np.asarray(logits), -1) - 1, 0, 6)].reshape(3, 2, 7)
    )


@pytest.mark.slow
@pytest.mark.parametrize("level", ["action", "token"])
def test_finer_logprob_levels_give_one_clipped_ratio_per_step_or_token(level):
    from rlinf_jax.sharding import data_mesh
    from rlinf_jax.tasks.embodied import ppo
    from rlinf_jax.tasks.embodied.setup import make_setup
    from rlinf_jax.tasks.embodied.algorithm import PPO

    cfg = load_config("ppo_vla_tabletop", [*TINY_VLA, f"actor.model.vla.logprob_level={level}"])
    algorithm = PPO(cfg, make_setup(cfg), data_mesh(1))
    params = algorithm._init_params
    model = algorithm.learner.model(params)
    obs = _obs(batch=4)
    keys = jax.random.split(jax.random.PRNGKey(2), 4)
    _, bins, logprob = algorithm.policy.act(model, obs, keys)
    logits, _ = model(obs)
    lp = _log_softmax(np.asarray(logits, np.float64) / algorithm.policy.temperature)
    token_lp = np.take_along_axis(lp, np.asarray(bins)[..., None], -1)[..., 0]  # [4, 14]
    per_unit = token_lp if level == "token" else token_lp.reshape(4, 2, 7).sum(-1)
    np.testing.assert_allclose(np.asarray(logprob), per_unit, rtol=1e-5, atol=1e-5)

    # A behaviour policy that differs per unit, so some ratios clip and others do not.
    rng = np.random.default_rng(5)
    old = per_unit + rng.uniform(-0.4, 0.4, per_unit.shape)
    adv = np.array([1.0, -2.0, 0.5, -0.3])
    batch = {
        "obs": obs, "raw_action": bins, "logprob": jnp.asarray(old, jnp.float32),
        "advantage": jnp.asarray(adv, jnp.float32), "return": jnp.zeros(4),
    }
    _, metrics = ppo.loss(algorithm.learner, params, None, batch, jax.random.PRNGKey(0))
    a = (adv - adv.mean()) / (adv.std() + 1e-8) if cfg.algorithm.normalize_advantages else adv
    eps = cfg.algorithm.clip_eps
    terms = [
        max(-a[i] * np.exp(per_unit[i, j] - old[i, j]), -a[i] * np.clip(np.exp(per_unit[i, j] - old[i, j]), 1 - eps, 1 + eps))
        for i in range(4)
        for j in range(per_unit.shape[1])
    ]
    np.testing.assert_allclose(float(metrics["train/policy_loss"]), np.mean(terms), rtol=1e-4, atol=1e-6)
    ratio = np.exp(per_unit - old)
    A = np.broadcast_to(a[:, None], ratio.shape)
    clipped = -A * np.clip(ratio, 1 - eps, 1 + eps) > -A * ratio  # the clipped term is the one taken
    assert 0 < clipped.mean() < 1
    np.testing.assert_allclose(float(metrics["train/clip_frac"]), clipped.mean(), atol=1e-6)


def test_action_slots_read_each_other_and_the_instruction():
    _, _, model = _policy()
    obs = _obs()
    logits, _ = model(obs)
    # Bidirectional slots: moving the last slot's query moves the first slot's logits.
    model.oft.slot_embed[...] = model.oft.slot_embed[...].at[-1].add(1.0)
    moved, _ = model(obs)
    assert float(jnp.abs(moved[:, 0] - logits[:, 0]).max()) > 1e-4
    # The instruction reaches the slots: a different instruction, different logits.
    other = dict(obs, tokens=obs["tokens"][::-1])
    flipped, _ = model(other)
    assert float(jnp.abs(flipped[0] - moved[2]).max()) > 1e-4 or float(jnp.abs(flipped[0] - moved[0]).max()) > 1e-4


def test_group_advantages_compare_each_episode_with_its_group():
    from rlinf_jax.sharding import data_mesh
    from rlinf_jax.tasks.embodied import ppo
    from rlinf_jax.tasks.embodied.setup import make_setup
    from rlinf_jax.tasks.embodied.algorithm import PPO

    cfg = load_config(
        "grpo_vla_tabletop", [*TINY_VLA, "env.num_envs=8", "env.group_size=4", "algorithm.reward_scale=2.0"]
    )
    algorithm = PPO(cfg, make_setup(cfg), data_mesh(1))
    rewards = np.random.default_rng(3).normal(size=(2, 8)).astype(np.float32)
    rewards[:, 4:] = 1.0  # the second group's episodes are all equal: zero advantages
    adv, ret, _ = ppo.advantages(algorithm.learner, None, None, SimpleNamespace(reward=jnp.asarray(rewards)), None)
    totals = 2.0 * rewards.sum(0)
    expected = np.zeros(8)
    for g in range(2):
        r = totals[4 * g : 4 * g + 4]
        if np.ptp(r) > 0:
            expected[4 * g : 4 * g + 4] = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
    np.testing.assert_allclose(np.asarray(adv), np.broadcast_to(expected, (2, 8)), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ret), np.broadcast_to(totals, (2, 8)), rtol=1e-6)


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("env.group_size=1", "set env.group_size >= 2"),
        ("algorithm.rollout_length=1", "one whole episode per env per iteration"),
        ("env.terminate_on_success=true", "env.terminate_on_success=false"),
    ],
)
def test_group_advantages_refuse_settings_without_whole_grouped_episodes(override, fragment):
    from rlinf_jax.sharding import data_mesh
    from rlinf_jax.tasks.embodied.setup import make_setup
    from rlinf_jax.tasks.embodied.algorithm import PPO

    cfg = load_config("grpo_vla_tabletop", [*TINY_VLA, override])
    with pytest.raises(BadInput, match=fragment):
        PPO(cfg, make_setup(cfg), data_mesh(1))


@pytest.mark.slow
def test_behaviour_cloning_fits_the_expert_bins():
    from rlinf_jax.tasks.embodied.cloning import behaviour_clone, expert_bins

    _, policy, model = _policy()
    graphdef, params = nnx.split(model)
    obs = _obs(batch=24, seed=5)
    # An "expert" whose chunk is a fixed function of proprioception and instruction.
    p = np.asarray(obs["proprio"])
    actions = np.tanh(np.stack([p[:, [0, 1, 2, 3, 0, 1, 2]], -p[:, [3, 2, 1, 0, 3, 2, 1]]], axis=1))
    data = {**{k: np.asarray(v) for k, v in obs.items()}, "action": actions.astype(np.float32)}
    bins = expert_bins(policy, data["action"])
    assert bins.shape == (24, 14) and bins.min() >= 0 and bins.max() < 8
    # The bins decode back to the centre nearest each action (within half a bin width).
    centres = np.asarray(policy.env_action(jnp.asarray(bins))).reshape(24, 14)
    assert np.abs(centres - actions.reshape(24, 14)).max() <= (2 / 7) / 2 + 1e-6 + 2 / 7
    new, loss, acc = behaviour_clone(policy, graphdef, params, data, steps=80, lr=3e-3, batch_size=24, seed=0)
    assert loss[-1] < 0.5 * loss[0], (loss[0], loss[-1])
    assert acc[-1] > 0.6, acc[-1]
    fitted = nnx.merge(graphdef, new)
    logits, _ = fitted(obs)
    assert np.mean(np.argmax(np.asarray(logits), -1) == bins) > 0.6


@pytest.mark.slow
def test_dagger_labels_the_policys_own_states_with_the_experts_chunks():
    from rlinf_jax.envs.tabletop import episode_id
    from rlinf_jax.envs.tabletop.expert import expert_actions
    from rlinf_jax.envs.tabletop.visits import policy_visits
    from rlinf_jax.tasks.embodied.cloning import dagger_clone

    cfg, policy, model = _policy()
    env = make_env(cfg.env).unwrapped
    graphdef, params = nnx.split(model)
    ids = jnp.asarray(episode_id("train", np.array([3, 1, 4, 1])), jnp.int32)
    got = jax.device_get(jax.jit(lambda p: policy_visits(env, policy, graphdef, p, ids, 3, jax.random.PRNGKey(0), True))(params))
    # Reference: a plain Python loop over the same env, the greedy policy acting, the
    # expert asked at each state but never acting. Each piece is jitted on its own (run
    # eagerly, op by op, MJX's step takes ~10 s here); the loop stays the reference's.
    reset, step = jax.jit(env.reset_to), jax.jit(env.step)
    expert = jax.jit(lambda s: expert_actions(env, s))
    act = jax.jit(lambda p, obs: policy.act_deterministic(nnx.merge(graphdef, p), obs))
    state, finished = reset(ids), np.zeros(4, bool)
    for t in range(3):
        np.testing.assert_array_equal(got["image"][:, t], np.asarray(state.obs["image"]))
        np.testing.assert_allclose(got["action"][:, t], np.asarray(expert(state)), atol=1e-6)
        np.testing.assert_array_equal(got["valid"][:, t], ~finished)
        state = step(state, act(params, state.obs))
        finished |= (np.asarray(state.done) > 0) | (np.asarray(state.info["success"]) > 0)
    # 4-sub-step episodes are 2 chunks of 2: the third state comes after the end
    assert got["valid"][:, :2].all() and not got["valid"][:, 2].any()
    assert got["success"].shape == (4,)

    demos = {**{k: np.asarray(v) for k, v in _obs(batch=8, seed=2).items()}, "action": np.zeros((8, 2, 7), np.float32)}
    new, hist = dagger_clone(
        policy, graphdef, params, make_env(cfg.env), demos, steps=3, lr=1e-3, batch_size=8, seed=0,
        rounds=2, episodes=4, round_steps=2,
    )
    assert len(hist["loss"]) == 3 and len(hist["success"]) == 2
    assert all(np.isfinite(hist["loss"]))
    with pytest.raises(BadInput, match="dagger"):
        dagger_clone(policy, graphdef, params, make_env(cfg.env), demos, steps=3, lr=1e-3, batch_size=8, seed=0,
                     rounds=1, episodes=0, round_steps=2)


def test_discounted_returns_stop_at_the_episode_end():
    from rlinf_jax.algos.imitation import discounted_returns

    rng = np.random.default_rng(0)
    reward = rng.normal(size=(3, 6)).astype(np.float32)
    live = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]], bool)
    got = discounted_returns(reward, live, 0.9)
    for b in range(3):
        end = live[b].sum()
        for t in range(6):
            want = sum(0.9 ** (k - t) * reward[b, k] for k in range(t, end)) if t < end else 0.0
            assert got[b, t] == pytest.approx(want, abs=1e-5)


def changed_leaves(before, after) -> set[str]:
    """The paths of the leaves that differ between two parameter trees of one structure."""
    paths = lambda t: {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(t)[0]}  # noqa: E731
    a, b = paths(before), paths(after)
    return {k for k in a if not np.array_equal(a[k], b[k])}


@pytest.mark.slow
def test_critic_warmup_fits_only_the_value_head():
    from rlinf_jax.tasks.embodied.cloning import fit_value_head

    cfg, policy, model = _policy()
    graphdef, params = nnx.split(model)
    new, err = fit_value_head(policy, graphdef, params, make_env(cfg.env), episodes=8, steps=60, lr=1e-2,
                              batch_size=8, gamma=0.9, reward_scale=10.0, seed=0)
    moved = changed_leaves(params, new)
    assert moved and all(k.startswith("['value']") for k in moved), moved
    assert np.isfinite(err)


@pytest.mark.slow
@pytest.mark.devices(2)
def test_vla_ppo_iteration_is_the_same_collocated_disaggregated_and_hybrid():
    ppo_iteration_in_each_layout("ppo_vla_tabletop", TINY_VLA)


def ppo_iteration_in_each_layout(recipe, overrides):
    """One PPO iteration of ``recipe`` fused (collocated), disaggregated (staged) and hybrid:
    the same metrics, parameters and episode strip in each. Returns each layout's (metrics,
    parameter leaves)."""
    # Hybrid: env on device 0, rollout on device 1, the batch in 2 micro-batches streaming
    # between them (cached resets, which micro-batches can split), the actor on both.
    from rlinf_jax.flow.fused import Fused
    from rlinf_jax.tasks.embodied.build import build_trainer

    layouts = {
        "fused": ["flow.runner=fused"],
        "disaggregated": ["cluster.component_placement=disaggregated", "flow.runner=staged"],
        "hybrid": ["cluster.component_placement=hybrid", "flow.num_micro_batches=2"],
    }
    out, strips = {}, {}
    for name, extra in layouts.items():
        trainer = build_trainer(load_config(recipe, [*overrides, "env.reset_mode=cached", *extra]))
        state = trainer.init()
        before = jax.tree.leaves(jax.device_get(trainer.snapshot(state)).params)
        # The episode strip TensorBoard shows at evaluations, drawn in every layout.
        strips[name] = trainer.strip(state, jax.random.PRNGKey(3), 2)
        if isinstance(trainer, Fused):
            state, sums = trainer.run_chunk(state, jnp.int32(1))
        else:
            state, sums = trainer.run_iterations(state, 1)
        out[name] = (trainer.summarize(sums, 1), jax.tree.leaves(jax.device_get(trainer.snapshot(state)).params))
        assert max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(out[name][1], before)) > 0, name
    ref_metrics, ref_params = out["fused"]
    assert strips["fused"].ndim == 3 and strips["fused"].std() > 0
    assert abs(ref_metrics["train/approx_kl"]) > 0 or ref_metrics["train/total_loss"] != 0
    for name in ("disaggregated", "hybrid"):
        np.testing.assert_array_equal(strips[name], strips["fused"], err_msg=name)
        metrics, params = out[name]
        for key, value in ref_metrics.items():
            np.testing.assert_allclose(metrics[key], value, rtol=1e-3, atol=1e-4, err_msg=f"{name} {key}")
        for a, b in zip(params, ref_params):
            np.testing.assert_allclose(np.ravel(a)[:64], np.ravel(b)[:64], rtol=1e-3, atol=2e-4, err_msg=name)
    return out


def _read_png(path):
    """A minimal PNG reader for what `write_png` writes (8-bit RGB, filter 0)."""
    import struct
    import zlib

    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        assert struct.unpack(">I", data[pos + 8 + n : pos + 12 + n])[0] == zlib.crc32(kind + body) & 0xFFFFFFFF
        chunks[kind] = chunks.get(kind, b"") + body
        pos += 12 + n
    w, h = struct.unpack(">II", chunks[b"IHDR"][:8])
    raw = np.frombuffer(zlib.decompress(chunks[b"IDAT"]), np.uint8).reshape(h, 1 + 3 * w)
    assert (raw[:, 0] == 0).all()
    return raw[:, 1:].reshape(h, w, 3)


def test_image_strip_lays_episodes_in_rows_and_round_trips_through_png(tmp_path):
    from rlinf_jax.runtime.media import image_strip, write_png

    frames = np.random.default_rng(0).integers(0, 256, (3, 2, 4, 5, 3), dtype=np.uint8)  # T=3, B=2
    strip = image_strip(frames, gap=1)
    assert strip.shape == (2 * 4 + 1, 3 * 5 + 2, 3)
    np.testing.assert_array_equal(strip[5:9, 12:17], frames[2, 1])  # episode 1, step 2
    assert (strip[4] == 255).all() and (strip[:, 5] == 255).all()  # the gaps
    path = write_png(tmp_path / "s.png", strip)
    np.testing.assert_array_equal(_read_png(path), strip)
    with pytest.raises(BadInput, match="exists"):
        write_png(path, strip)


def test_a_vla_run_shows_success_per_split():
    """The bar and the summary of a tabletop run lead with success per split, the metric its
    runs are judged by; a control run's show returns."""
    import io

    from rich.console import Console

    from rlinf_jax.flow.progress import ProgressBar
    from rlinf_jax.tasks.embodied.run import EmbodiedLoop
    from rlinf_jax.tasks.env_rl.summary import RunSummary, split_success

    evaluation = {"eval/return": 0.17893, "eval/success": 0.28125, "eval/success/train": 0.28125,
                  "eval/success/vision": 0.1875, "eval/success/semantic": 0.25, "eval/success/execution": 0.125}
    shown = EmbodiedLoop(load_config("ppo_vla_tabletop", TINY_VLA), None, None, None).shown
    assert list(shown) == [f"eval/success/{s}" for s in ("train", "vision", "semantic", "execution")] + [
        "time/env_steps_per_sec"]
    assert "eval/return" in EmbodiedLoop(load_config("ppo_brax"), None, None, None).shown
    with ProgressBar(10, 0, True, Console(file=io.StringIO(), width=200), "train", shown, "") as bar:
        bar.update(5, {**evaluation, "time/env_steps_per_sec": 8256.0})
    assert bar.fields == {"success: train": "0.281", "vision": "0.188", "semantic": "0.25", "execution": "0.125",
                          "steps/s": "8,256"}
    text = RunSummary("runs/v", 40, 1000, 0.17893, 8256.0, 30.0, 200.0, None, split_success(evaluation)).text()
    assert "final eval success train 0.281, vision 0.188, semantic 0.250, execution 0.125" in text
    assert "final eval return  0.179" in text  # not 0.2


@pytest.mark.slow
def test_sft_then_ppo_from_it_then_evaluate_with_every_split_and_a_strip(tmp_path):
    from tests.conftest import run_cli

    out = f"runner.output_dir={tmp_path}"
    # Demos need episodes long enough for the expert to finish (it needs about 24 sub-steps);
    # the SFT run's config, not the RL run's, shapes the state its checkpoint is read onto.
    # One DAgger round (at step 2 of 4) adds the cloned policy's own states.
    sft = [*TINY_VLA_MODEL, "env.episode_length=32", "runner.max_steps=4", "runner.eval_interval=4", "sft.num_demos=4",
           "sft.batch_size=8", "sft.dagger_rounds=1", "sft.dagger_episodes=4", "runner.log_interval=2", out]
    proc = run_cli(["--config-name", "sft_vla_tabletop", *sft, "runner.experiment_name=s"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "s" / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["step"] == 0 and "eval/success/vision" in records[0]
    assert records[-1]["step"] == 4 and np.isfinite(records[-1]["train/bc_loss"])
    # 4 episodes of 16 chunks, every state before the end or a success labelled
    assert records[0]["sft/demo_steps"] < records[-1]["sft/demo_steps"] <= records[0]["sft/demo_steps"] + 64
    assert 0.0 <= records[-1]["sft/dagger_success"] <= 1.0

    # An RL run starts from exactly the SFT run's last parameters...
    from rlinf_jax.tasks.embodied.build import build_trainer
    from rlinf_jax.runtime.checkpoint import Checkpointer, _key_str

    def by_path(tree):
        leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
        return {".".join(_key_str(k) for k in path): np.asarray(x) for path, x in leaves}

    model_path = f"actor.model.path={tmp_path / 's'}"
    trainer = build_trainer(load_config("ppo_vla_tabletop", [*TINY_VLA, model_path]))
    started = by_path(jax.device_get(trainer.init().params))
    saved, _ = Checkpointer(tmp_path / "s" / "checkpoints").restore(None, None)
    saved = by_path(saved["params"])
    assert started.keys() == saved.keys()
    for key, value in saved.items():
        np.testing.assert_array_equal(started[key], value, err_msg=key)

    # ... and evaluates them at step 0, like a warm start.
    run = [*TINY_VLA, "runner.max_steps=1", "runner.eval_interval=1", out, model_path]
    proc = run_cli(["--config-name", "ppo_vla_tabletop", *run, "runner.experiment_name=v"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "v" / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["step"] == 0 and "eval/success/train" in records[0]
    last = records[-1]
    assert {f"eval/success/{s}" for s in ("train", "vision", "semantic", "execution")} <= set(last)
    # A run that is not a VLA SFT run is refused in one line, and nothing is written.
    proc = run_cli(["--config-name", "ppo_vla_tabletop", *run, "runner.experiment_name=w",
                    f"actor.model.path={tmp_path / 'v'}"])
    assert proc.returncode == 2 and "runner.task=embodied run" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "w").exists()

    strip = tmp_path / "strip.png"
    cmd = [sys.executable, "-m", "rlinf_jax.evaluate", str(tmp_path / "v"), "--strip", str(strip), "--strip-episodes", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["step"] == 1 and 0.0 <= report["eval/success/semantic"] <= 1.0
    # The run's own evaluation of that step, episode for episode: the numbers it logged.
    assert report["protocol"] == "the run's own evaluation at step 1"
    for key in ("eval/return", *(f"eval/success/{s}" for s in ("train", "vision", "semantic", "execution"))):
        assert report[key] == pytest.approx(last[key], abs=1e-6), key
    # 2 episodes of 16 px frames; 4 sub-steps in chunks of 2: the first frame and 2 steps.
    assert _read_png(strip).shape == (2 * 16 + 1, 3 * 16 + 2, 3)
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert again.returncode == 2 and "exists" in again.stderr


def test_bf16_backbone_keeps_float32_parameters_and_close_logits():
    cfg, policy32, model32 = _policy()
    _, policy16, model16 = _policy("actor.model.dtype=bfloat16")
    assert policy16.dtype == jnp.bfloat16
    params = nnx.state(model16, nnx.Param)
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
    nnx.update(model16, nnx.state(model32, nnx.Param))  # same weights, bf16 compute
    obs = _obs()
    l32, _ = model32(obs)
    l16, _ = model16(obs)
    assert l16.dtype == jnp.float32  # logits come out in float32 either way
    assert float(jnp.abs(l16 - l32).max()) < 0.05 * float(jnp.abs(l32).max()) + 0.05


def test_gpu_recipe_builds_a_model_of_realistic_size():
    from rlinf_jax.policies.embodied import embodied_policy

    cfg = load_config("ppo_vla_tabletop_gpu", ["env.num_envs=4", "env.num_eval_envs=4"])
    policy = embodied_policy(cfg, make_env(cfg.env))
    abstract = nnx.eval_shape(lambda: policy.build(nnx.Rngs(0)))
    n = sum(x.size for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
    assert 80e6 < n < 150e6, n
    assert policy.num_slots == 8 * 7 and policy.dtype == jnp.bfloat16


@pytest.mark.slow
def test_every_split_is_evaluated_as_its_own_rollout_would():
    """The splits run through one traced rollout (`PPO.evaluate`); each split's
    success, and the main split's return and length, equal a rollout of that split's own
    eval env from the same key (the naive loop, one program per split)."""
    from rlinf_jax.rollout import evaluate_policy
    from rlinf_jax.sharding import data_mesh
    from rlinf_jax.tasks.embodied.setup import make_setup
    from rlinf_jax.flow.fused import Fused
    from rlinf_jax.tasks.embodied.algorithm import PPO

    cfg = load_config("ppo_vla_tabletop", [*TINY_VLA, "env.name=vision", "env.episode_length=6"])
    trainer = Fused(PPO(cfg, make_setup(cfg), data_mesh(1)))
    algorithm = trainer.algorithm
    ts = trainer.init()
    key = jax.random.PRNGKey(7)
    got = jax.device_get(trainer.evaluate(ts.params, ts.obs_stats, key))
    policy = algorithm.deterministic(ts.params, ts.obs_stats)
    # The reference for the main split and one other (each a program of its own: the
    # others' would only repeat them at the cost of their compiles).
    for split in ("vision", "execution"):
        env = algorithm.split_eval_envs[split]
        ret, length, success = jax.jit(lambda k, env=env: evaluate_policy(env, policy, k, cfg.env.episode_length))(key)
        assert got[f"eval/success/{split}"] == pytest.approx(float(np.mean(success)), abs=1e-6), split
        if split == "vision":  # the split it trains on is the main evaluation
            assert got["eval/success"] == pytest.approx(float(np.mean(success)), abs=1e-6)
            assert got["eval/return"] == pytest.approx(float(np.mean(ret)), rel=1e-5, abs=1e-6)
            assert got["eval/episode_length"] == pytest.approx(float(np.mean(length)) * algorithm.substeps, rel=1e-6)
            assert np.std(ret) > 1e-3  # shaped returns that differ per episode: a real comparison
    assert set(got) >= {f"eval/success/{s}" for s in ("train", "vision", "semantic", "execution")}
