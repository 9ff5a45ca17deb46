"""Runs under faults, as users meet them: every command exits (promptly, on every path),
checkpoints are verified, a diverging run keeps its last good checkpoint, a resume never
destroys, bad input is one line. docs/failure_behaviour.md states these promises."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import jax
import numpy as np
import pytest

import rlinf_jax.tasks.embodied.run as embodied_run
from rlinf_jax.flow.host_loop import TrainingDiverged
from rlinf_jax.runtime import Checkpointer, read_metrics
from rlinf_jax.runtime.run_lock import LOCK_FILE
from rlinf_jax.tasks.embodied.run import run
from rlinf_jax.tasks.registry import load_run_config
from rlinf_jax.cli.train import main
from tests.conftest import TINY, run_child
from tests.test_sft import TINY_LM
from tests.test_run_lock import HOLDER
from tests.test_tensorboard import check_run
from tests.test_vla_flow import TINY_VLA

# A command has exited "promptly" when the interpreter is gone within this many seconds of
# main returning (it was over 20 minutes when a checkpoint manager closed from __del__).
PROMPT_S = 15.0


def _one_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("error: "), stderr[-2000:]
    # Nothing follows the error line (orbax's "Event loop is closed" did once).
    return lines[-1]


def _files(run_dir: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def _run_dir_args(tmp_path, name="r", *extra):
    return [*TINY, f"runner.output_dir={tmp_path}", f"runner.experiment_name={name}", "runner.tensorboard=false",
            "runner.compilation_cache=''", *extra]


def _alter_array_data(ckpts: Path, step: int, scratch: Path) -> None:
    """Gives checkpoint ``step`` other array values that orbax still reads without complaint:
    the silent corruption checksums exist for. Flipping bytes of orbax's data files does not
    do it reliably (their chunks are zstd-compressed, so most flips fail decompression), so
    the step's state is rewritten with one value changed and its checksums.json kept."""
    with Checkpointer(ckpts) as ckpt:
        state, meta = ckpt._read(step, [step], None)
    leaves, treedef = jax.tree.flatten(state)
    at = max((i for i, x in enumerate(leaves) if np.issubdtype(np.asarray(x).dtype, np.floating)),
             key=lambda i: np.size(leaves[i]))
    changed = np.array(leaves[at], copy=True)
    changed.reshape(-1)[0] += 1.0
    leaves[at] = changed
    with Checkpointer(scratch) as ckpt:
        ckpt.save(step, jax.tree.unflatten(treedef, leaves), meta)
    shutil.rmtree(ckpts / str(step) / "state")
    shutil.copytree(scratch / str(step) / "state", ckpts / str(step) / "state")


def test_no_thread_or_process_outlives_a_run(tmp_path):
    """What made processes hang at exit: resources with threads closed from __del__, or not
    at all. After main returns nothing of the run's may still run."""
    import multiprocessing

    before = set(threading.enumerate())
    assert main(_run_dir_args(tmp_path, "r", "runner.max_steps=2", "runner.save_interval=1")) == 0
    lingering = [t for t in threading.enumerate() if t not in before and t.is_alive() and not t.daemon]
    assert not lingering, lingering
    assert not multiprocessing.active_children()


@pytest.mark.slow
@pytest.mark.parametrize("workload", ["embodied", "sft", "reasoning", "vla"])
def test_every_workload_exits_promptly_after_its_last_line(tmp_path, workload):
    where = [f"runner.output_dir={tmp_path}", "runner.experiment_name=w", "runner.tensorboard=true"]
    args = {
        # With the compilation cache (the others' default too): the tiny PPO programs other
        # tests compiled load in seconds, and the evaluations below reuse this run's.
        "embodied": [*TINY, *where, "runner.max_steps=2", "runner.save_interval=1"],
        "sft": ["--config-name", "sft_math", *TINY_LM, *where, "runner.max_steps=2", "runner.eval_interval=2",
                "data.eval_size=8"],
        "reasoning": ["--config-name", "grpo_math", *TINY_LM, *where, "runner.max_steps=2", "sft.warm_start_steps=2",
                      "data.rollout_batch_size=4", "algorithm.lm.group_size=2", "actor.global_batch_size=8",
                      "actor.micro_batch_size=8", "data.eval_size=8", "sft.batch_size=8"],
        "vla": ["--config-name", "ppo_vla_tabletop", *TINY_VLA, *where, "runner.max_steps=2", "runner.eval_interval=2",
                "runner.save_interval=1"],
    }[workload]
    proc, lag = run_child("train", args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "saved in" in proc.stdout
    assert lag is not None and lag < PROMPT_S, lag
    # What TensorBoard's reader finds of the run (tests/test_tensorboard.py).
    check_run(workload, tmp_path / "w")
    if workload == "embodied":
        # The other commands on the run it left: evaluate a checkpoint, and refuse a damaged one.
        proc, lag = run_child("evaluate", [str(tmp_path / "w")], tmp_path)
        assert proc.returncode == 0 and json.loads(proc.stdout.strip().splitlines()[-1])["eval/return"] is not None
        assert lag is not None and lag < PROMPT_S, lag
        # Damage orbax cannot read past: its restore fails with reads still in flight, whose
        # reports once followed the error line (a dozen "Event loop is closed" tracebacks).
        for data in (tmp_path / "w" / "checkpoints" / "2" / "state" / "d").iterdir():
            raw = bytearray(data.read_bytes())
            raw[len(raw) // 2 : len(raw) // 2 + 64] = bytes(b ^ 0xFF for b in raw[len(raw) // 2 : len(raw) // 2 + 64])
            data.write_bytes(bytes(raw))
        proc, lag = run_child("evaluate", [str(tmp_path / "w" / "checkpoints" / "2")], tmp_path)
        assert proc.returncode == 2 and "corrupt or unreadable" in _one_error_line(proc.stderr)
        assert len([ln for ln in proc.stderr.splitlines() if ln.strip()]) == 1, proc.stderr[-3000:]
        assert lag is not None and lag < PROMPT_S, lag


@pytest.mark.slow
def test_convert_exits_promptly_on_success_and_on_bad_input(tmp_path):
    from rlinf_jax.policies.lm.tiny import save_tiny

    src, _ = save_tiny("qwen2", tmp_path / "hf")
    proc, lag = run_child("convert", ["--from", str(src), "--to", str(tmp_path / "out")], tmp_path)
    assert proc.returncode == 0 and json.loads(proc.stdout.strip().splitlines()[-1])["model_type"] == "qwen2"
    assert lag is not None and lag < PROMPT_S, lag
    proc, lag = run_child("convert", ["--from", str(src), "--to", str(tmp_path / "out")], tmp_path)
    assert proc.returncode == 2 and "not empty" in _one_error_line(proc.stderr)
    assert lag is not None and lag < PROMPT_S, lag


def _only_line(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


# "": the fault lands in the main thread once orbax's save returned; "thread": inside orbax's
# own background thread with the save's other threads running (their failures once
# printed 28-660 lines of tracebacks around ours, and left the temporary folder behind).
@pytest.mark.slow
@pytest.mark.parametrize("where", ["", "thread"])
def test_ctrl_c_during_a_save_exits_130_and_keeps_the_last_checkpoint(tmp_path, where):
    proc, lag = run_child("train", _run_dir_args(tmp_path, "r", "runner.max_steps=4", "runner.save_interval=1"),
                          tmp_path, fault="sigint", fault_at=2, fault_where=where)
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert _only_line(proc.stderr).startswith("interrupted:") and lag is not None and lag < PROMPT_S, lag
    with Checkpointer(tmp_path / "r" / "checkpoints") as ckpt:
        assert ckpt.all_steps() == [1]  # the interrupted save left nothing behind
    assert [p.name for p in (tmp_path / "r" / "checkpoints").iterdir()] == ["1"]  # no temporary folder either
    # ... and the run continues from there.
    assert main(_run_dir_args(tmp_path, "r", "runner.max_steps=3", "runner.save_interval=1", "runner.resume=auto")) == 0


@pytest.mark.slow
@pytest.mark.parametrize("where", ["", "thread"])
def test_a_full_disk_is_one_error_line_and_keeps_the_last_checkpoint(tmp_path, where):
    proc, lag = run_child("train", _run_dir_args(tmp_path, "r", "runner.max_steps=4", "runner.save_interval=1"),
                          tmp_path, fault="enospc", fault_at=2, fault_where=where)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = _only_line(proc.stderr)
    assert line.startswith("error: ") and "(No space left on device)" in line
    assert "latest complete checkpoint is step 1" in line
    assert lag is not None and lag < PROMPT_S
    with Checkpointer(tmp_path / "r" / "checkpoints") as ckpt:
        assert ckpt.all_steps() == [1] and ckpt.verified(1, None)
    assert [p.name for p in (tmp_path / "r" / "checkpoints").iterdir()] == ["1"]


@pytest.mark.slow
def test_a_corrupt_checkpoint_is_refused_naming_one_that_verifies(tmp_path):
    assert main(_run_dir_args(tmp_path, "r", "runner.max_steps=3", "runner.save_interval=1")) == 0
    ckpts = tmp_path / "r" / "checkpoints"
    _alter_array_data(ckpts, 3, tmp_path / "scratch")
    before = _files(tmp_path / "r")
    proc, lag = run_child("train", _run_dir_args(tmp_path, "r", "runner.max_steps=5", "runner.save_interval=1",
                                                 "runner.resume=auto"), tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = _one_error_line(proc.stderr)
    assert "fails its checksums" in line and "the newest checkpoint that verifies is step 2" in line
    assert lag is not None and lag < PROMPT_S
    assert _files(tmp_path / "r") == before  # nothing written


@pytest.mark.slow
def test_a_diverging_run_saves_nothing_unhealthy_and_names_a_good_checkpoint(tmp_path):
    assert main(_run_dir_args(tmp_path, "r", "runner.max_steps=2", "runner.save_interval=1",
                              "runner.keep_checkpoints=2")) == 0
    # A learning rate that blows the parameters up: the updates after the first are non-finite.
    cfg = load_run_config("ppo_brax", _run_dir_args(
        tmp_path, "r", "runner.max_steps=12", "runner.save_interval=1", "runner.keep_checkpoints=2",
        "runner.resume=auto", "runner.max_nonfinite_updates=3", "actor.optim.lr=1e30",
    ))
    with pytest.raises(TrainingDiverged) as e:
        run(cfg)
    ckpts = tmp_path / "r" / "checkpoints"
    with Checkpointer(ckpts) as ckpt:
        steps = ckpt.all_steps()
        named = int(str(e.value).split("the last good checkpoint is ")[1].split("/")[-1])
        assert named == steps[-1] and 1 <= len(steps) <= 2
        state, _ = ckpt.restore(named, None)  # it verifies
    records = read_metrics(tmp_path / "r")
    assert any(r.get("checkpoint/skipped_unhealthy") for r in records)
    assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(state["params"]))


@pytest.mark.slow
def test_resume_into_a_run_with_later_checkpoints_is_refused(tmp_path, capsys):
    assert main(_run_dir_args(tmp_path, "a", "runner.max_steps=2", "runner.save_interval=1")) == 0
    assert main(_run_dir_args(tmp_path, "b", "runner.max_steps=3", "runner.save_interval=1")) == 0
    capsys.readouterr()
    before = _files(tmp_path / "b")
    older = tmp_path / "a" / "checkpoints" / "1"
    assert main(_run_dir_args(tmp_path, "b", "runner.max_steps=3", f"runner.resume={older}")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "runner.resume_overwrite=true" in err
    assert _files(tmp_path / "b") == before
    # Own checkpoint 1 while 2 and 3 exist: also refused, also untouched.
    own = tmp_path / "b" / "checkpoints" / "1"
    assert main(_run_dir_args(tmp_path, "b", "runner.max_steps=3", f"runner.resume={own}")) == 2
    assert _files(tmp_path / "b") == before
    # Said explicitly: the later future is replaced.
    assert main(_run_dir_args(tmp_path, "b", "runner.max_steps=2", f"runner.resume={own}",
                              "runner.resume_overwrite=true")) == 0
    with Checkpointer(tmp_path / "b" / "checkpoints") as ckpt:
        assert ckpt.all_steps() == [1, 2]


def test_a_rejected_run_leaves_its_folder_untouched(tmp_path, capsys):
    assert main(_run_dir_args(tmp_path, "r", "runner.max_steps=2", "runner.save_interval=1")) == 0
    metrics = tmp_path / "r" / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join([lines[0], "{garbled", *lines[1:]]) + "\n")
    before = _files(tmp_path / "r")
    capsys.readouterr()
    assert main(_run_dir_args(tmp_path, "r", "runner.max_steps=3", "runner.resume=auto", "runner.seed=7")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "metrics.jsonl line 2" in err
    assert _files(tmp_path / "r") == before  # config.yaml and placement.json not rewritten


def test_a_fresh_start_over_an_unsaved_run_is_refused(tmp_path, capsys):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 0, "time/compile_sec": 1.0}) + "\n")
    assert main(_run_dir_args(tmp_path, "r", "runner.max_steps=1")) == 2
    assert "saved no checkpoint" in capsys.readouterr().err
    shutil.rmtree(run_dir)


def test_a_disk_that_fills_while_logging_is_one_error_line(tmp_path, monkeypatch, capsys):
    """The disk fills between checkpoints: the metrics file's write fails. One line, exit 2,
    and the checkpoint saved before it restores."""
    import errno

    from rlinf_jax.runtime.metrics import MetricsLogger

    real_log, calls = MetricsLogger.log, {"n": 0}

    def log(self, step, metrics):
        calls["n"] += 1
        if step >= 2 and self.write:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_log(self, step, metrics)

    monkeypatch.setattr(MetricsLogger, "log", log)
    assert main(_run_dir_args(tmp_path, "r", "runner.max_steps=3", "runner.save_interval=1", "runner.log_interval=1")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "No space left on device" in err and "runner.resume=auto" in err
    monkeypatch.setattr(MetricsLogger, "log", real_log)
    with Checkpointer(tmp_path / "r" / "checkpoints") as ckpt:
        assert ckpt.latest_step() is not None and ckpt.verified(ckpt.latest_step(), None)


def test_a_finished_run_has_nothing_to_do_and_a_live_one_refuses_a_second_writer(tmp_path, capsys, monkeypatch):
    assert main(_run_dir_args(tmp_path, "r", "runner.max_steps=2", "runner.save_interval=1")) == 0
    umask = os.umask(0)
    os.umask(umask)
    for name in ("config.yaml", "placement.json", "metrics.jsonl"):  # every file reads alike
        assert (tmp_path / "r" / name).stat().st_mode & 0o777 == 0o666 & ~umask, name
    assert not (tmp_path / "r" / LOCK_FILE).exists()  # released at the end
    capsys.readouterr()
    before = _files(tmp_path / "r")
    # Nothing left to train: one line and exit 0, before anything is built or compiled.
    monkeypatch.setattr(embodied_run, "make_setup", lambda cfg: pytest.fail("a setup was built"))
    for steps in (2, 1):
        assert main(_run_dir_args(tmp_path, "r", f"runner.max_steps={steps}", "runner.resume=auto")) == 0
        out = capsys.readouterr().out.strip()
        assert out.startswith("nothing to do:") and "\n" not in out, out
        assert "at step 2" in out and f"runner.max_steps={steps}" in out
    assert _files(tmp_path / "r") == before
    # While another process writes the folder, a second writer (a resume included) is
    # refused in one line naming it, before it reads a checkpoint the holder may rotate.
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "r")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = _files(tmp_path / "r")
        for resume in ("none", "auto"):
            assert main(_run_dir_args(tmp_path, "r", "runner.max_steps=4", f"runner.resume={resume}")) == 2
            err = capsys.readouterr().err.strip()
            assert err.startswith("error: run folder ") and "\n" not in err, err
            assert f"is in use by pid {holder.pid}" in err
        assert _files(tmp_path / "r") == before
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


def test_a_crash_exits_70_with_one_line_and_the_traceback_in_the_run_folder(tmp_path, capsys, monkeypatch):
    def setup_with_a_bug(cfg):
        raise RuntimeError("an unexpected bug")

    monkeypatch.setattr(embodied_run, "make_setup", setup_with_a_bug)
    assert main(_run_dir_args(tmp_path, "r", "runner.max_steps=1")) == 70
    err = capsys.readouterr().err.strip()
    assert err.startswith("crash: RuntimeError: an unexpected bug (the traceback is in ") and "\n" not in err, err
    report = Path(err.split("the traceback is in ")[1].split(";")[0])
    assert report.parent == tmp_path / "r" and report.name.startswith("crash-")
    text = report.read_text()
    assert "Traceback (most recent call last)" in text and "in setup_with_a_bug" in text
    assert not (tmp_path / "r" / LOCK_FILE).exists()


def test_the_other_commands_exit_70_on_a_crash(tmp_path, capsys, monkeypatch):
    import rlinf_jax.api
    from rlinf_jax.collect import main as collect_main
    from rlinf_jax.cli.convert import main as convert_main

    def broken(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where reports go without a run folder

    monkeypatch.setattr(rlinf_jax.api, "convert", broken)
    assert convert_main(["--from", str(tmp_path / "hf"), "--to", str(tmp_path / "out")]) == 70
    monkeypatch.setattr("rlinf_jax.collect._collect", broken)
    assert collect_main([str(tmp_path), "--transitions", "4", "--out", str(tmp_path / "t.parquet")]) == 70
    for line in capsys.readouterr().err.strip().splitlines():
        assert line.startswith("crash: KeyError: 'a bug' (the traceback is in "), line
        assert "in broken" in Path(line.split("the traceback is in ")[1].split(";")[0]).read_text()


@pytest.mark.slow
def test_a_folder_of_numbered_folders_that_are_not_checkpoints_is_one_line(tmp_path):
    for step in range(1, 7):
        (tmp_path / "n" / "checkpoints" / str(step)).mkdir(parents=True)
    # max_steps below the highest number: still not "nothing to do", since none is a checkpoint.
    proc, _ = run_child("train", _run_dir_args(tmp_path, "n", "runner.max_steps=2", "runner.resume=auto"), tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = _only_line(proc.stderr)  # orbax's dozen warnings about missing metadata once came first
    assert line.startswith("error: checkpoint ") and "checkpoints/6 is corrupt or unreadable" in line


def test_evaluate_exits_70_on_a_crash_with_the_report_in_the_run_folder(tmp_path, capsys, monkeypatch):
    from rlinf_jax.cli.evaluate import main as evaluate_main

    run_dir = tmp_path / "r"
    (run_dir / "checkpoints" / "3").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("")

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr("rlinf_jax.tasks.saved.evaluate_run", broken)
    assert evaluate_main([str(run_dir / "checkpoints" / "3")]) == 70
    line = _only_line(capsys.readouterr().err)
    assert line.startswith("crash: ZeroDivisionError: a bug (the traceback is in ")
    report = Path(line.split("the traceback is in ")[1].split(";")[0])
    assert report.parent == run_dir and "in broken" in report.read_text()
