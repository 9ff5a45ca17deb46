"""Reasoning runs end to end: SFT warm start then GRPO raising the reward, exact resume,
collocated = disaggregated = hybrid on 8 fake devices, bad data files at the CLI, and
the evaluation CLI (pass@1 / pass@k)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from rlinf_jax.runtime import read_metrics
from rlinf_jax.cli.train import main

# A 2-layer, 64-wide model on single-digit sums: a 60-step warm start answers a few.
TINY_LM = [
    "actor.model.lm.hidden_size=64",
    "actor.model.lm.intermediate_size=128",
    "actor.model.lm.num_layers=2",
    "actor.model.lm.num_heads=2",
    "actor.model.lm.num_kv_heads=1",
    "data.train_levels=[1]",
    "data.eval_levels=[1]",
    "data.eval_size=32",
    "rollout.max_new_tokens=12",
    "rollout.eval_batch_size=32",
]
QUIET = ["runner.progress_bar=false", "runner.tensorboard=false"]
TINY = [
    *TINY_LM,
    *QUIET,
    "data.rollout_batch_size=8",
    "algorithm.lm.group_size=4",
    "actor.global_batch_size=16",
    "actor.micro_batch_size=8",
    "algorithm.update_epochs=2",
]


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """A warm-started tiny model (an SFT run folder) shared by the tests of this file."""
    out = tmp_path_factory.mktemp("warm")
    assert main(["--config-name", "sft_math", *TINY_LM, *QUIET, f"runner.output_dir={out}", "runner.experiment_name=sft",
                 "runner.max_steps=60", "actor.optim.lr=3e-3", "actor.global_batch_size=64",
                 "actor.micro_batch_size=64", "runner.eval_interval=0", "runner.save_interval=0"]) == 0
    return out / "sft"


def rl(tmp_path, warm, name, *extra):
    return ["--config-name", "grpo_math", *TINY, f"runner.output_dir={tmp_path}", f"runner.experiment_name={name}",
            f"actor.model.path={warm}", "runner.log_interval=1", *extra]


def strip(records):
    return [{k: v for k, v in r.items() if not k.startswith("time/") and k != "rollout/tokens_per_sec"} for r in records]


@pytest.mark.slow
def test_grpo_after_sft_raises_the_reward(tmp_path, warm):
    # Two sums the warm start gets right about one time in six when sampling; GRPO learns
    # them from the reward alone.
    data = tmp_path / "two.jsonl"
    data.write_text('{"prompt": "What is 3 + 1?", "answer": "4"}\n{"prompt": "What is 4 + 5?", "answer": "9"}\n')
    args = rl(tmp_path, warm, "up", "data.source=files", f"data.train_path={data}", f"data.eval_path={data}",
              "data.rollout_batch_size=2", "algorithm.lm.group_size=16", "algorithm.update_epochs=1",
              "actor.global_batch_size=32", "actor.micro_batch_size=32", "actor.optim.lr=1e-3",
              "runner.max_steps=20", "runner.eval_interval=20")
    assert main(args) == 0
    records = read_metrics(tmp_path / "up")
    acc = [r["rollout/accuracy"] for r in records if "rollout/accuracy" in r]
    assert np.mean(acc[-5:]) > np.mean(acc[:5]) + 0.15, acc
    assert records[-1]["eval/accuracy"] > records[0]["eval/accuracy"], records


@pytest.mark.slow
def test_resume_continues_exactly(tmp_path, warm):
    # A constant learning rate: a linear decay would tie the schedule to runner.max_steps,
    # which the cut run (stopped at 2, as a killed run would be) sets differently.
    extra = ("runner.save_interval=2", "runner.eval_interval=2", "algorithm.lm.kl_coef=0.01",
             "actor.optim.lr_schedule=constant")
    assert main(rl(tmp_path, warm, "full", "runner.max_steps=4", *extra)) == 0
    assert main(rl(tmp_path, warm, "cut", "runner.max_steps=2", *extra)) == 0
    assert main(rl(tmp_path, warm, "cut", "runner.max_steps=4", "runner.resume=auto", *extra)) == 0
    full, cut = read_metrics(tmp_path / "full"), read_metrics(tmp_path / "cut")
    assert [r["step"] for r in full] == [0, 1, 2, 3, 4]
    assert strip(cut) == strip(full)
    assert {"train/kl", "rollout/clip_rate", "rollout/truncation_rate", "rollout/response_length",
            "reward/accuracy", "eval/accuracy", "time/update_sec"} <= set(full[-1])
    placement = json.loads((tmp_path / "full" / "placement.json").read_text())
    assert set(placement["components"]) == {"rollout", "reference", "actor"}


@pytest.mark.slow
@pytest.mark.devices(8)
def test_collocated_disaggregated_and_hybrid_give_the_same_metrics(tmp_path, warm):
    results = {}
    for name, placement, extra in [
        ("collocated", "collocated", ()),
        ("disaggregated", "disaggregated", ()),
        ("hybrid", "hybrid", ()),  # rollout 0-3, reference 4-7, actor on all 8
        # rollout 0-1, reference 2-3, actor 4-7; the update on all 8. Checkpoints
        # every iteration: the run resumed from the middle below starts from one.
        ("dynamic", "disaggregated", ("cluster.scaling=dynamic", "runner.save_interval=1")),
    ]:
        argv = rl(tmp_path, warm, name, "runner.max_steps=3", "runner.eval_interval=3", "algorithm.lm.kl_coef=0.01",
                  f"cluster.component_placement={placement}", *extra)
        assert main(argv) == 0
        run_dir = tmp_path / name
        results[name] = (read_metrics(run_dir / "metrics.jsonl"), json.loads((run_dir / "placement.json").read_text()))
    modes = {k: placement["mode"] for k, (_, placement) in results.items()}
    assert modes == {"collocated": "collocated", "disaggregated": "disaggregated", "hybrid": "hybrid",
                     "dynamic": "disaggregated"}
    dynamic = results["dynamic"][1]
    assert dynamic["scaling"] == "dynamic" and results["disaggregated"][1]["scaling"] == "static"
    assert dynamic["phases"]["update"] == {"devices": list(range(8)), "mesh_shape": {"data": 8},
                                           "axis_names": ["data"]}
    assert all(r["time/switch_s"] > 0 for r in results["dynamic"][0][1:])
    # A dynamic run resumed from its checkpoint of iteration 2 repeats iteration 3.
    assert main(rl(tmp_path, warm, "resumed", "runner.max_steps=3", "runner.eval_interval=3", "algorithm.lm.kl_coef=0.01",
                   "cluster.component_placement=disaggregated", "cluster.scaling=dynamic",
                   f"runner.resume={tmp_path / 'dynamic' / 'checkpoints' / '2'}")) == 0
    resumed = strip(read_metrics(tmp_path / "resumed"))
    assert resumed[-1] == strip(results["dynamic"][0])[-1]
    devices = results["disaggregated"][1]["components"]
    assert devices["actor"]["devices"] == [4, 5, 6, 7] and devices["rollout"]["devices"] == [0, 1]
    hybrid = results["hybrid"][1]
    assert hybrid["requested"] == "hybrid" and hybrid["derived"] == {"rollout": "0-3", "reference": "4-7", "actor": "0-7"}
    base = strip(results["collocated"][0])
    assert any(r.get("rollout/accuracy", 0) > 0 for r in base)  # rewards vary: the comparison means something
    for name in ("disaggregated", "hybrid", "dynamic"):
        other = strip(results[name][0])
        assert [r.keys() for r in other] == [r.keys() for r in base]
        for a, b in zip(base, other):
            for k in a:
                assert b[k] == pytest.approx(a[k], rel=2e-3, abs=2e-5), (name, a["step"], k)


@pytest.mark.parametrize("content, expected", [
    ('{"question": "What is 1 + 1?", "answer": "2"}\n', "has no key 'prompt'"),
    ("", "is empty"),
    ("{not json\n", "not valid JSON"),
    (None, "is a directory"),
])
def test_bad_data_files_are_one_error_line(tmp_path, capsys, content, expected):
    path = tmp_path / "data.jsonl"
    if content is None:
        path.mkdir()
    else:
        path.write_text(content)
    runs = tmp_path / "runs"
    code = main(["--config-name", "grpo_math", "data.source=files", f"data.train_path={path}",
                 f"runner.output_dir={runs}", "runner.progress_bar=false"])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("error: ") and "\n" not in err and expected in err, err
    assert not runs.exists(), "bad input must not create anything"


def test_unreadable_data_file_is_one_error_line(tmp_path, capsys):
    if os.geteuid() == 0:
        pytest.skip("root reads any file")
    path = tmp_path / "data.jsonl"
    path.write_text('{"prompt": "a", "answer": "1"}\n')
    path.chmod(0)
    assert main(["--config-name", "sft_math", "data.source=files", f"data.train_path={path}",
                 f"runner.output_dir={tmp_path / 'runs'}"]) == 2
    assert capsys.readouterr().err.startswith("error: cannot read data file")


@pytest.mark.slow
def test_evaluate_cli_pass_at_k(tmp_path, warm, capsys):
    from rlinf_jax.cli.evaluate import main as evaluate

    data = tmp_path / "probe.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n"
                            for a, b in [(1, 2), (3, 4), (5, 1), (2, 2)]))
    out = tmp_path / "report.json"
    assert evaluate(["--checkpoint", str(warm), "--data", str(data), "--k", "1", "4", "--seed", "1",
                     "--out", str(out), "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    report = json.loads(out.read_text())
    assert summary["problems"] == 4 and summary["samples_per_problem"] == 4 and summary["step"] == 60
    correct = np.array([r["correct"] for r in report["records"]])
    assert correct.shape == (4, 4) and len(report["records"][0]["responses"]) == 4
    # pass@1 is the mean correctness; pass@4 with 4 samples is "any of them right".
    assert summary["pass@1"] == pytest.approx(correct.mean())
    assert summary["pass@4"] == pytest.approx(correct.max(axis=1).mean())
    # Greedy by default; the same seed gives the same report.
    assert evaluate(["--checkpoint", str(warm), "--data", str(data), "--out", str(out), "--no-progress"]) == 0
    greedy = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert greedy["temperature"] == 0.0 and greedy["samples_per_problem"] == 1
    assert evaluate(["--checkpoint", str(warm), "--data", str(tmp_path / "missing.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err
    # Overrides after --checkpoint reach the run's config: its held-out split, resized.
    assert evaluate(["--checkpoint", str(warm), "data.eval_size=3", "--no-progress"]) == 0
    held = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert held["data"] == "heldout" and held["problems"] == 3
