"""End-to-end training runs: learning, kill-and-resume equality, non-finite guard, bad resumes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlinf_jax.config import load_config
from rlinf_jax.flow.host_loop import TrainingDiverged
from rlinf_jax.tasks.embodied.build import build_trainer
from rlinf_jax.tasks.embodied.run import run
from rlinf_jax.runtime import Checkpointer, read_metrics
from rlinf_jax.cli.train import main
from tests.conftest import TINY, run_cli


def _comparable(records):
    """Metrics minus wall-clock timings, which legitimately differ between runs."""
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]


@pytest.mark.slow
@pytest.mark.optimized
def test_default_recipe_learns(tmp_path, capsys):
    # The default recipe, shortened: the eval return must rise far above a random policy's.
    code = main(
        [
            f"runner.output_dir={tmp_path}",
            "runner.max_steps=12",
            "runner.eval_interval=12",
            "runner.save_interval=12",
            "runner.progress_bar=false",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "final eval return" in out and "env-steps/s" in out and "compile time" in out
    records = read_metrics(tmp_path / "ppo_brax_inverted_pendulum" / "metrics.jsonl")
    first_return = next(r["env/return"] for r in records if "env/return" in r)
    final_eval = records[-1]["eval/return"]
    assert first_return < 100, first_return
    assert final_eval > 500, records[-1]
    assert "time/env_steps_per_sec" in records[-1] and "time/compile_sec" in records[0]
    placement = json.loads((tmp_path / "ppo_brax_inverted_pendulum" / "placement.json").read_text())
    assert placement["mode"] == "collocated"
    assert placement["components"]["actor"]["mesh_shape"] == {"data": jax.device_count()}


@pytest.mark.slow
def test_killed_and_resumed_run_matches_uninterrupted(tmp_path):
    common = [
        *TINY,
        "runner.max_steps=12",
        "runner.save_interval=4",
        "runner.log_interval=2",
        "runner.eval_interval=4",
        f"runner.output_dir={tmp_path}",
    ]
    straight = run_cli([*common, "runner.experiment_name=straight"])
    assert straight.returncode == 0, straight.stderr[-2000:]

    # Killed once its first checkpoint appears. A starved test process may see it only after
    # the run has finished (the last steps take well under a second): then the run is
    # started again in a fresh folder, up to three times.
    for attempt in range(3):
        name = f"killed{attempt}"
        ckpts = tmp_path / name / "checkpoints"
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlinf_jax.train", *common, f"runner.experiment_name={name}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if ckpts.is_dir() and any(p.name.isdigit() and int(p.name) >= 4 for p in ckpts.iterdir()):
                break
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if proc.returncode == -signal.SIGKILL:
            break
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed, three times"
    killed_at = max(int(p.name) for p in ckpts.iterdir() if p.name.isdigit())
    assert killed_at < 12

    resumed = run_cli([*common, f"runner.experiment_name={name}", "runner.resume=auto"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from step" in resumed.stdout

    a = _comparable(read_metrics(tmp_path / "straight" / "metrics.jsonl"))
    b = _comparable(read_metrics(tmp_path / name / "metrics.jsonl"))
    assert [r["step"] for r in a] == [r["step"] for r in b]
    assert a == b  # bit for bit: same programs, same inputs, same machine


def _params(run_dir, step):
    state, _ = Checkpointer(run_dir / "checkpoints").restore(step, None)
    return jax.tree.leaves(state["params"])


@pytest.mark.slow
def test_nonfinite_updates_never_reach_parameters(tmp_path, tiny):
    assert main([*tiny, "runner.max_steps=2", "runner.save_interval=2"]) == 0
    run_dir = tmp_path / "t"
    good = _params(run_dir, 2)
    # NaN rewards make every loss NaN: updates are skipped, counted, and the run stops.
    # The loader rejects a NaN reward_scale, so it is set on the validated config.
    cfg = load_config(
        "ppo_brax",
        [*tiny, "runner.resume=auto", "runner.max_steps=20", "runner.save_interval=1", "runner.max_nonfinite_updates=3"],
    )
    cfg.algorithm.reward_scale = float("nan")
    with pytest.raises(TrainingDiverged, match="non-finite"):
        run(cfg)
    records = read_metrics(run_dir / "metrics.jsonl")
    assert records[-1]["train/skipped_updates"] > 0
    for step in Checkpointer(run_dir / "checkpoints").all_steps():
        for a, b in zip(good, _params(run_dir, step)):
            np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_resume_with_mismatched_config_is_bad_input(tmp_path, tiny, capsys):
    assert main([*tiny, "runner.max_steps=2"]) == 0
    run_dir = tmp_path / "t"
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    code = main([*tiny, "runner.max_steps=4", "runner.resume=auto", "actor.model.value_hidden_sizes=[8]"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and "\n" not in err
    assert "shape" in err
    after = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    assert before == after, "a rejected resume must leave the run directory untouched"


def test_fresh_start_refuses_to_overwrite_a_run(tmp_path, tiny, capsys):
    assert main([*tiny, "runner.max_steps=1"]) == 0
    capsys.readouterr()
    assert main([*tiny, "runner.max_steps=1"]) == 2
    assert "runner.resume=auto" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.devices(8)
def test_one_and_eight_devices_agree():
    out = {}
    for n in ("1", "8"):
        trainer = build_trainer(load_config("ppo_brax", [*TINY, f"cluster.num_devices={n}"]))
        ts, sums = trainer.run_chunk(trainer.init(), jnp.int32(3))
        out[n] = (len(ts.env_state.obs.sharding.device_set), trainer.summarize(sums, 3), jax.tree.leaves(ts.params))
    assert out["1"][0] == 1 and out["8"][0] == 8
    for a, b in zip(out["1"][2], out["8"][2]):
        np.testing.assert_allclose(np.sum(np.asarray(a)), np.sum(np.asarray(b)), rtol=2e-4, atol=2e-4)
    for key, value in out["1"][1].items():
        np.testing.assert_allclose(out["8"][1][key], value, rtol=2e-3, atol=2e-3, err_msg=key)


@pytest.mark.slow
def test_playground_env_trains_checkpoints_and_resumes(tmp_path, tiny, capsys):
    # MJX states hold zero-size arrays and hundreds of leaves: the checkpoint path must cope.
    pg = [*tiny, "env.suite=playground", "env.name=CartpoleBalance", "env.backend=jax", "env.episode_length=50"]
    assert main([*pg, "runner.max_steps=2", "runner.save_interval=1"]) == 0
    assert main([*pg, "runner.max_steps=3", "runner.save_interval=1", "runner.resume=auto"]) == 0
    assert "resumed from step 2" in capsys.readouterr().out
    assert Checkpointer(tmp_path / "t" / "checkpoints").latest_step() == 3
