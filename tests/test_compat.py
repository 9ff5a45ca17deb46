"""Checkpoints written before the `tasks/` reorganisation (commit 5fe10a3, see
tests/data/legacy_5fe10a3/README.md) restore with today's code and give the numbers that
commit computed from them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlinf_jax.config import load_config_file
from rlinf_jax.runtime import Checkpointer, read_metrics
from rlinf_jax.tasks.saved import evaluate_run as evaluate
from rlinf_jax.tasks.reasoning.trainer import ReasoningTrainer
from rlinf_jax.tasks.sft.lm_model import load_checkpoint_policy
from rlinf_jax.cli.train import main

LEGACY = Path(__file__).resolve().parent / "data" / "legacy_5fe10a3"
EXPECTED = json.loads((LEGACY / "expected.json").read_text())


@pytest.fixture
def legacy(tmp_path):
    """A copy of the legacy runs (their config.yaml files name a folder that is gone)."""
    dst = tmp_path / "legacy"
    shutil.copytree(LEGACY, dst)
    return dst


def _close(got: dict, want: dict, rtol=1e-5):
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=rtol, abs=1e-6), key


def test_embodied_checkpoint_evaluates_to_the_same_numbers(legacy):
    _close(evaluate(legacy / "embodied", seed=3), EXPECTED["embodied_eval_seed3"])


@pytest.mark.slow
def test_vla_sft_checkpoint_evaluates_to_the_same_numbers(legacy):
    _close(evaluate(legacy / "sft_vla", seed=3), EXPECTED["sft_vla_eval_seed3"])


def test_embodied_run_resumed_from_an_old_checkpoint_continues_as_it_did(legacy, tmp_path):
    cfg = load_config_file(legacy / "embodied" / "config.yaml")
    overrides = [
        f"runner.output_dir={tmp_path / 'runs'}", "runner.experiment_name=resumed", "runner.max_steps=3",
        "runner.save_interval=3", "runner.eval_interval=3", "runner.log_interval=1",
        f"runner.resume={legacy / 'embodied' / 'checkpoints' / '2'}",
        f"env.num_envs={cfg.env.num_envs}", f"env.num_eval_envs={cfg.env.num_eval_envs}",
        f"env.episode_length={cfg.env.episode_length}", f"algorithm.rollout_length={cfg.algorithm.rollout_length}",
        f"algorithm.num_minibatches={cfg.algorithm.num_minibatches}", "algorithm.update_epochs=1",
        "actor.model.policy_hidden_sizes=[8]", "actor.model.value_hidden_sizes=[8]",
        "runner.progress_bar=false", "runner.tensorboard=false", "runner.compilation_cache=''",
    ]
    assert main(overrides) == 0
    (record,) = read_metrics(tmp_path / "runs" / "resumed" / "metrics.jsonl")
    # approx_kl and clip_frac changed definition since (now the peers' k1 and clipped-term
    # share); every other number is what 5fe10a3 computed.
    redefined = ("train/approx_kl", "train/clip_frac")
    want = {k: v for k, v in EXPECTED["embodied_resumed_step3"].items() if not k.startswith("time/") and k not in redefined}
    _close(record, want, rtol=1e-4)


@pytest.mark.parametrize("run", ["sft", "reasoning"])
def test_language_model_checkpoints_load_the_same_policy(legacy, run):
    model, point = load_checkpoint_policy(legacy / run)
    assert point.step == 2
    ids = jnp.asarray([EXPECTED["lm_logits_input"]], jnp.int32)
    logits = np.asarray(model.logits(model.hidden_states(ids, jnp.ones_like(ids))))[0, -1, :12]
    np.testing.assert_allclose(logits, EXPECTED["lm_logits"][run], rtol=1e-5, atol=1e-6)


def test_reasoning_checkpoint_restores_onto_todays_trainer_state(legacy):
    """The state of a LoRA + value-model (gae) run, optimiser included, has the structure
    today's trainer builds, so `runner.resume` can continue it."""
    cfg = load_config_file(legacy / "reasoning" / "config.yaml")
    trainer = ReasoningTrainer(cfg)
    try:
        template = jax.device_get(trainer.snapshot(trainer.init()))
        restored, meta = Checkpointer(legacy / "reasoning" / "checkpoints").restore(2, template)
    finally:
        trainer.close()
    assert int(restored.step) == 2 and meta["task"] == "reasoning" and set(restored.params) == {"policy", "lora", "value"}
    raw, _ = Checkpointer(legacy / "reasoning" / "checkpoints").restore(2, None)
    for a, b in zip(jax.tree.leaves(restored.params["lora"]), jax.tree.leaves(raw["params"]["lora"])):
        np.testing.assert_array_equal(a, b)
