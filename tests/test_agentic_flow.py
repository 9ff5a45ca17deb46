"""Agentic reasoning runs end to end (agent.enabled): a tool-use SFT warm start, multi-turn
GRPO with the calculator in its worker process, exact resume, the same numbers on every
layout, per-turn statistics in the metrics, and bad agent settings at the command line."""

from __future__ import annotations

import json

import pytest

from rlinf_jax.runtime import read_metrics
from rlinf_jax.cli.train import main

TINY = [
    "actor.model.lm.hidden_size=64", "actor.model.lm.intermediate_size=128", "actor.model.lm.num_layers=2",
    "actor.model.lm.num_heads=2", "actor.model.lm.num_kv_heads=1",
    "data.train_levels=[1]", "data.eval_levels=[1]", "data.eval_size=16", "rollout.eval_batch_size=16",
    "runner.progress_bar=false", "runner.tensorboard=false", "runner.log_interval=1",
    "data.rollout_batch_size=4", "algorithm.lm.group_size=4", "actor.global_batch_size=8", "actor.micro_batch_size=8",
    "agent.max_turns=2", "agent.max_turn_tokens=32", "agent.max_episode_tokens=80",
    "sft.warm_start_steps=80", "sft.lr=3e-3", "sft.batch_size=32", "sft.train_levels=[1]",
    "data.sft_tool_fraction=1.0",  # transcripts only: 80 steps learn the call syntax
    "actor.optim.lr_schedule=constant",
]


def run(tmp_path, name, *extra, recipe="grpo_tool_calc"):
    return main(["--config-name", recipe, *TINY, f"runner.output_dir={tmp_path}",
                 f"runner.experiment_name={name}", *extra])


def strip(records):
    return [{k: v for k, v in r.items() if not k.startswith("time/") and not k.endswith("tokens_per_sec")}
            for r in records]


@pytest.mark.slow
@pytest.mark.optimized
def test_agentic_run_resumes_exactly_and_logs_turns(tmp_path):
    extra = ("runner.save_interval=2", "runner.eval_interval=2", "algorithm.lm.kl_coef=0.01", "agent.advantage_mode=turn")
    assert run(tmp_path, "full", "runner.max_steps=4", *extra) == 0
    assert run(tmp_path, "cut", "runner.max_steps=2", *extra) == 0
    assert run(tmp_path, "cut", "runner.max_steps=4", "runner.resume=auto", *extra) == 0
    full, cut = read_metrics(tmp_path / "full"), read_metrics(tmp_path / "cut")
    assert [r["step"] for r in full] == [0, 1, 2, 3, 4]
    assert strip(cut) == strip(full)
    last = full[-1]
    for k in ("turns", "tool_calls", "tool_errors", "format_errors", "tokens_generated", "tokens_observed"):
        assert f"rollout/agent/{k}" in last and f"eval/agent/{k}" in last
    assert {"train/kl", "eval/accuracy", "rollout/accuracy", "rollout/uniform_groups"} <= set(last)
    assert 0.0 <= last["rollout/uniform_groups"] <= 1.0
    # The warm start learnt the call syntax: tools are called and their results read.
    assert max(r["rollout/agent/tool_calls"] for r in full[1:]) > 0
    assert max(r["rollout/agent/tokens_observed"] for r in full[1:]) > 0
    # The evaluation CLI scores the run's checkpoint on whole episodes, as the run's own evaluation did.
    from rlinf_jax.cli.evaluate import main as evaluate

    out = tmp_path / "eval.json"
    assert evaluate(["--checkpoint", str(tmp_path / "full"), "--out", str(out), "--no-progress"]) == 0
    report = json.loads(out.read_text())
    assert report["accuracy"] == pytest.approx(last["eval/accuracy"])
    assert report["agent/turns"] == pytest.approx(last["eval/agent/turns"])
    assert report["agent/tool_calls"] == pytest.approx(last["eval/agent/tool_calls"])


@pytest.mark.slow
@pytest.mark.devices(8)
@pytest.mark.optimized
def test_agentic_layouts_give_the_same_metrics(tmp_path):
    results = {}
    # The third: disaggregated with cluster.scaling=dynamic, the update borrowing the
    # rollout's devices (4 + 4).
    # The warm start always runs collocated (SFT has the actor alone): the other layouts
    # start from the first run's, as a run given actor.model.path does.
    warm = f"actor.model.path={tmp_path / 'collocated' / 'sft'}"
    for name, extra in (("collocated", ()),
                        ("disaggregated", ("cluster.component_placement=disaggregated", warm)),
                        ("dynamic", ("cluster.component_placement=disaggregated", "cluster.scaling=dynamic",
                                     "runner.save_interval=1", warm)),
                        # resumed from the dynamic run's checkpoint of iteration 1
                        ("resumed", ("cluster.component_placement=disaggregated", "cluster.scaling=dynamic", warm,
                                     f"runner.resume={tmp_path / 'dynamic' / 'checkpoints' / '1'}"))):
        assert run(tmp_path, name, "runner.max_steps=2", "runner.eval_interval=2", *extra) == 0
        results[name] = read_metrics(tmp_path / name)
    assert all(r["time/switch_s"] > 0 for r in results["dynamic"][1:])
    assert strip(results["resumed"])[-1] == strip(results["dynamic"])[-1]
    a = strip(results["collocated"])
    for name in ("disaggregated", "dynamic"):
        b = strip(results[name])
        assert [r["step"] for r in a] == [r["step"] for r in b]
        for ra, rb in zip(a, b):
            assert ra.keys() == rb.keys()
            for k in ra:
                assert ra[k] == pytest.approx(rb[k], rel=1e-3, abs=1e-4), (name, k)


@pytest.mark.parametrize("extra, words", [
    (["algorithm.adv_type=rloo"], "algorithm.adv_type=grpo"),
    (["agent.tools=[shell]"], "agent.tools"),
    (["agent.max_turns=0"], "agent.max_turns"),
    (["agent.tools=[search]"], "agent.search_documents"),
])
def test_bad_agent_settings_are_one_line_errors(tmp_path, capsys, extra, words):
    assert run(tmp_path, "bad", *extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error:") and words in err[-1]


@pytest.mark.slow
def test_search_recipe_runs_with_the_generated_collection(tmp_path):
    assert run(tmp_path, "search", "runner.max_steps=2", "runner.eval_interval=2", "agent.max_turns=2",
               "agent.max_turn_tokens=48", "agent.max_episode_tokens=128", recipe="grpo_tool_search") == 0
    last = read_metrics(tmp_path / "search")[-1]
    # The short warm start has learnt to search: calls go out and results come back.
    assert last["rollout/agent/tool_calls"] > 0.5 and last["rollout/agent/tokens_observed"] > 0
    assert last["rollout/agent/tool_errors"] < last["rollout/agent/tool_calls"]
