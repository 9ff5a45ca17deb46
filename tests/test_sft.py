"""SFT of a causal LM: the loss against a hand-computed NLL, gradient accumulation, the CLI run
with checkpoints and an exact resume, and target encoding."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlinf_jax.config import load_config
from rlinf_jax.data import CharTokenizer
from rlinf_jax.errors import BadInput
from rlinf_jax.rollout.lm_io import encode_targets
from rlinf_jax.tasks.sft.lm import SFTTrainer, train_step
from rlinf_jax.tasks.sft.lm_setup import policy_weights
from rlinf_jax.runtime import read_metrics

# A model small enough to compile and train in seconds.
TINY_LM = [
    "actor.model.lm.hidden_size=32",
    "actor.model.lm.intermediate_size=64",
    "actor.model.lm.num_layers=1",
    "actor.model.lm.num_heads=2",
    "actor.model.lm.num_kv_heads=1",
    "data.eval_size=16",
    "rollout.max_new_tokens=12",
    "rollout.eval_batch_size=16",
    "runner.progress_bar=false",
    "runner.tensorboard=false",
]


def sft_overrides(tmp_path, name="s", *extra):
    return [*TINY_LM, f"runner.output_dir={tmp_path}", f"runner.experiment_name={name}", *extra]


def _trainer(tmp_path, *extra):
    cfg = load_config("sft_math", sft_overrides(tmp_path, "s", "actor.global_batch_size=8", "actor.micro_batch_size=8",
                                                "actor.optim.warmup_steps=0", *extra))
    return SFTTrainer(cfg)


def test_sft_loss_is_the_target_token_nll(tmp_path):
    trainer = _trainer(tmp_path)
    ts = trainer.init()
    batch = jax.device_get(trainer.next_batch())
    _, metrics = train_step(trainer.step_spec, ts, batch)

    # Reference: each row on its own, unpadded (prompt + target), through the plain forward.
    from flax import nnx

    model = nnx.merge(trainer.lm.graphdef, jax.device_get(ts.params["policy"]))
    nll, count = 0.0, 0
    for r in range(batch["tokens"].shape[0]):
        prompt = batch["prompt_ids"][r][batch["prompt_mask"][r] > 0]
        target = batch["tokens"][r][batch["response_mask"][r] > 0]
        seq = np.concatenate([prompt, target])
        logits = np.asarray(model(jnp.asarray(seq[None])))[0]
        logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(-1, keepdims=True)
        for j, tok in enumerate(target):
            nll -= logp[len(prompt) + j - 1, tok]
            count += 1
    assert float(metrics["train/loss"]) == pytest.approx(nll / count, rel=1e-4)
    assert float(metrics["train/target_tokens"]) == count


def test_gradient_accumulation_equals_one_big_batch(tmp_path):
    whole = _trainer(tmp_path)
    split = _trainer(tmp_path, "actor.micro_batch_size=2")
    ts_a, ts_b = whole.init(), split.init()
    batch = jax.device_get(whole.next_batch())
    new_a, ma = train_step(whole.step_spec, ts_a, batch)
    new_b, mb = train_step(split.step_spec, ts_b, batch)
    assert float(ma["train/loss"]) == pytest.approx(float(mb["train/loss"]), rel=1e-5)
    for a, b, before in zip(jax.tree.leaves(new_a.params), jax.tree.leaves(new_b.params), jax.tree.leaves(ts_a.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    assert not np.array_equal(np.asarray(before), np.asarray(a))  # the step did move the weights


def test_targets_are_boxed_answer_and_end_token():
    tok = CharTokenizer()
    ids, mask = encode_targets(tok, ["\\boxed{14}"], 12)
    assert tok.decode(ids[0][mask[0] > 0]) == "\\boxed{14}<eos>"
    assert mask.sum() == 11 and (ids[0][11:] == tok.pad_id).all()
    with pytest.raises(BadInput, match="rollout.max_new_tokens"):
        encode_targets(tok, ["\\boxed{123456}"], 8)


@pytest.mark.slow
def test_sft_cli_learns_checkpoints_and_resumes_exactly(tmp_path):
    from rlinf_jax.runtime import Checkpointer
    from rlinf_jax.cli.train import main

    common = ["--config-name", "sft_math", "actor.global_batch_size=16", "actor.micro_batch_size=8",
              "actor.optim.warmup_steps=0", "actor.optim.lr=3e-3",
              "runner.save_interval=4", "runner.eval_interval=4", "runner.log_interval=2"]
    assert main([*common, *sft_overrides(tmp_path, "full", "runner.max_steps=8")]) == 0
    full = read_metrics(tmp_path / "full")
    assert full[0]["step"] == 0 and full[0]["eval/accuracy"] == 0.0  # a random model answers nothing
    losses = [r["train/loss"] for r in full if "train/loss" in r]
    assert losses[-1] < losses[0] - 0.5, losses  # it learns
    assert {"train/lr", "train/grad_norm", "time/step_sec", "eval/accuracy"} <= set(full[-1])
    placement = json.loads((tmp_path / "full" / "placement.json").read_text())
    assert placement["runner"] == "SFTTrainer" and placement["mode"] == "collocated"

    # The checkpoint's metadata holds the loader cursor and the architecture.
    _, meta = Checkpointer(tmp_path / "full" / "checkpoints").restore(8, None)
    assert meta["loader"]["position"] == 8 * 16 % 10_000 and meta["lm_config"]["hidden_size"] == 32

    # Stop after 4 steps, resume to 8: the same records and parameters as the straight run.
    assert main([*common, *sft_overrides(tmp_path, "cut", "runner.max_steps=4")]) == 0
    assert main([*common, *sft_overrides(tmp_path, "cut", "runner.max_steps=8", "runner.resume=auto")]) == 0
    cut = read_metrics(tmp_path / "cut")

    def strip(records):
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]

    assert strip(cut) == strip(full)
    a, _ = Checkpointer(tmp_path / "full" / "checkpoints").restore(8, None)
    b, _ = Checkpointer(tmp_path / "cut" / "checkpoints").restore(8, None)
    for x, y in zip(jax.tree.leaves(a["params"]), jax.tree.leaves(b["params"])):
        np.testing.assert_array_equal(x, y)


def test_lora_starts_at_the_base_model_and_trains_only_the_adapters(tmp_path):
    from flax import nnx

    from rlinf_jax.policies.lm.lora import merge_host
    from rlinf_jax.policies.lm.hf_checkpoint import flatten_tree

    full = _trainer(tmp_path)
    lora = _trainer(tmp_path, "actor.model.lora_rank=4", "actor.model.lora_alpha=8")
    batch = jax.device_get(full.next_batch())
    ts = lora.init()
    _, m_full = train_step(full.step_spec, full.init(), batch)
    new, m_lora = train_step(lora.step_spec, ts, batch)
    # B = 0 at the start: the same model, the same loss.
    assert float(m_lora["train/loss"]) == pytest.approx(float(m_full["train/loss"]), rel=1e-6)
    before, after = jax.device_get(ts.params), jax.device_get(new.params)
    for x, y in zip(jax.tree.leaves(before["policy"]), jax.tree.leaves(after["policy"])):
        np.testing.assert_array_equal(x, y)  # the base is frozen
    assert any(not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(before["lora"]), jax.tree.leaves(after["lora"])))
    # 7 projections per layer get adapters; the merged weights are W + alpha/r * A @ B.
    assert len(after["lora"]) == 7
    merged = jax.device_get(policy_weights(lora.lora, after))
    key = "layers:0:attn:q_proj:kernel"
    w = np.asarray(after["policy"]["layers"][0]["attn"]["q_proj"]["kernel"][...])
    expect = w + 2.0 * after["lora"][key]["a"] @ after["lora"][key]["b"]
    np.testing.assert_allclose(np.asarray(merged["layers"][0]["attn"]["q_proj"]["kernel"][...]), expect, rtol=1e-5, atol=1e-7)
    # The host-side merge used when a LoRA checkpoint is loaded gives the same weights.
    stored = {k.removesuffix(".value"): v for k, v in flatten_tree(nnx.to_pure_dict(after["policy"])).items()}
    host = merge_host(stored, flatten_tree(after["lora"]), {"rank": 4, "alpha": 8})
    np.testing.assert_allclose(host["layers.0.attn.q_proj.kernel"], expect, rtol=1e-5, atol=1e-7)
