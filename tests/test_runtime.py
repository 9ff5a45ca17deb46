"""Run directory, metrics.jsonl + TensorBoard, orbax checkpoints and resume resolution."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlinf_jax.config import load_config, load_config_file
from rlinf_jax.errors import BadInput
from rlinf_jax.runtime import (
    Checkpointer,
    MetricsLogger,
    ResumePoint,
    RunDir,
    list_steps,
    read_metrics,
    resolve_resume,
    restore_checkpoint,
)

REPO = Path(__file__).resolve().parent.parent


def one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


def cfg_in(tmp_path, *overrides):
    return load_config(overrides=[f"runner.output_dir={tmp_path}", "runner.experiment_name=exp", *overrides])


def make_state(scale: float = 1.0, hidden: int = 4):
    return {
        "params": {
            "dense": {"kernel": jnp.full((3, hidden), scale, jnp.float32), "bias": np.zeros(hidden, np.float32)},
            "log_std": jnp.full((2,), -scale),
        },
        "opt": [{"count": jnp.asarray(3, jnp.int32), "mu": jnp.ones((3, hidden))}, None],
        "rng": jax.random.key_data(jax.random.key(int(scale))),
        "typed_rng": jax.random.key(7),
        "step": 12,
        "np_scalar": np.float32(scale),
    }


def assert_same(a, b):
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb
    for x, y in zip(la, lb):
        if hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# ----------------------------------------------------------------------------- run dir


def test_run_dir_paths_and_create(tmp_path):
    cfg = cfg_in(tmp_path, "actor.model.policy_hidden_sizes=[8]")
    rd = RunDir.from_config(cfg)
    assert rd.path == tmp_path / "exp"
    assert not rd.path.exists()  # from_config touches nothing
    rd2 = RunDir.create(cfg)
    assert rd2 == rd
    for p in (rd.path, rd.tensorboard, rd.checkpoints):
        assert p.is_dir()
    assert rd.config_yaml.is_file() and rd.metrics_jsonl.name == "metrics.jsonl"
    assert load_config_file(rd.config_yaml) == cfg
    assert not rd.has_checkpoints()
    assert not list(rd.path.glob(".*tmp"))  # the atomic write left no temp file


def test_run_dir_file_in_the_way(tmp_path):
    (tmp_path / "exp").write_text("x")
    with pytest.raises(BadInput) as e:
        RunDir.create(cfg_in(tmp_path))
    assert "runner.experiment_name" in one_line(e)


# ----------------------------------------------------------------------------- metrics


def read_tb_events(logdir: Path) -> list:
    """Every event of every event file under ``logdir``, parsed from the TFRecord framing."""
    from tensorboardX.proto import event_pb2

    events = []
    for f in sorted(logdir.glob("events.out.tfevents.*")):
        data = f.read_bytes()
        pos = 0
        while pos < len(data):
            (n,) = struct.unpack("<Q", data[pos:pos + 8])
            events.append(event_pb2.Event.FromString(data[pos + 12:pos + 12 + n]))
            pos += 12 + n + 4
    return events


def read_tb_scalars(logdir: Path) -> list[tuple[str, int, float]]:
    return [(v.tag, ev.step, v.simple_value) for ev in read_tb_events(logdir) for v in ev.summary.value]


def test_metrics_jsonl_format_and_tensorboard(tmp_path):
    rd = RunDir.create(cfg_in(tmp_path))
    with MetricsLogger(rd) as log:
        log.log(1, {"train/policy_loss": jnp.float32(0.5), "env/return": np.float64(3.25), "time/env_steps_per_sec": 1000})
        log.log(np.int64(2), {"train/policy_loss": jnp.asarray([0.25]), "eval/return": float("nan"),
                              "train/grad_norm": float("inf"), "train/x": -np.inf, "train/ok": True})
        lines = rd.metrics_jsonl.read_text().splitlines()  # flushed on every call
    assert len(lines) == 2

    def strict(s):
        raise AssertionError(f"non-standard JSON constant {s}")

    recs = [json.loads(line, parse_constant=strict) for line in lines]
    assert list(recs[0]) == ["step", "train/policy_loss", "env/return", "time/env_steps_per_sec"]
    assert recs[0] == {"step": 1, "train/policy_loss": 0.5, "env/return": 3.25, "time/env_steps_per_sec": 1000}
    assert isinstance(recs[0]["time/env_steps_per_sec"], int)
    assert recs[1]["eval/return"] == "nan" and recs[1]["train/grad_norm"] == "inf" and recs[1]["train/x"] == "-inf"
    assert recs[1]["train/ok"] == 1 and recs[1]["train/policy_loss"] == 0.25

    back = read_metrics(rd.path)
    assert np.isnan(back[1]["eval/return"]) and back[1]["train/grad_norm"] == float("inf")

    scalars = read_tb_scalars(rd.tensorboard)
    assert ("train/policy_loss", 1, 0.5) in scalars and ("env/return", 1, 3.25) in scalars
    assert ("train/policy_loss", 2, 0.25) in scalars


def test_tensorboard_writer_leaves_torch_unloaded(tmp_path):
    # tensorboardX's writer imports torch where it is installed (seconds of every run's
    # start); our writer hides it during that import. Writing still works, and torch
    # stays importable afterwards.
    pytest.importorskip("torch")
    code = textwrap.dedent(f"""
        import sys
        import numpy as np
        from rlinf_jax.runtime import MetricsLogger
        with MetricsLogger({str(tmp_path)!r}) as log:
            log.log(1, {{"train/loss": 0.5}})
            log.log_text(1, "notes", "hello")
            log.log_image(1, "frames", np.zeros((4, 4, 3), np.uint8))
            loaded = "torch" in sys.modules
        import torch
        print(loaded, torch.ones(2).sum().item())
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False", "2.0"]
    assert ("train/loss", 1, 0.5) in read_tb_scalars(tmp_path / "tensorboard")
    tags = {v.tag for ev in read_tb_events(tmp_path / "tensorboard") for v in ev.summary.value}
    assert {"frames", "notes/text_summary"} <= tags, tags


def test_metrics_reject_non_scalars(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as log:
        with pytest.raises(TypeError, match="train/vec"):
            log.log(1, {"train/vec": np.ones(3)})
        with pytest.raises(ValueError):
            log.log(1, {"step": 3})
    assert not (tmp_path / "tensorboard").exists()


def test_truncate_after_drops_later_steps_atomically(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=True) as log:
        for s in range(1, 7):
            log.log(s, {"train/loss": s})
        assert log.truncate_after(4) == 2
        log.log(5, {"train/loss": 50})
    recs = read_metrics(tmp_path)
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 5] and recs[-1]["train/loss"] == 50
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "tensorboard"]  # no temp left
    # The writer is reopened with purge_step=5, which makes TensorBoard hide the stale
    # step-5/6 events; the first writer's file must survive (same-second file names).
    from tensorboardX.proto.event_pb2 import SessionLog

    events = read_tb_events(tmp_path / "tensorboard")
    assert any(ev.session_log.status == SessionLog.START and ev.step == 5 for ev in events)
    scalars = read_tb_scalars(tmp_path / "tensorboard")
    assert ("train/loss", 1, 1.0) in scalars and ("train/loss", 5, 50.0) in scalars


def test_truncate_before_first_log_opens_one_event_file(tmp_path):
    with MetricsLogger(tmp_path) as log:
        log.log(1, {"a": 1})
        log.log(2, {"a": 2})
    with MetricsLogger(tmp_path) as log:  # a resumed run
        assert log.truncate_after(1) == 1
        log.log(2, {"a": 20})
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 2
    assert [r["a"] for r in read_metrics(tmp_path)] == [1, 20]


def test_torn_last_line_is_repaired_on_open(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1, "a": 1}\n{"step": 2, "a"')  # crash mid-write
    assert [r["step"] for r in read_metrics(p)] == [1]
    with MetricsLogger(tmp_path, tensorboard=False) as log:
        log.log(2, {"a": 2})
    assert [r["step"] for r in read_metrics(p)] == [1, 2]


def test_read_metrics_bad_inputs(tmp_path):
    with pytest.raises(BadInput):
        read_metrics(tmp_path / "none.jsonl")
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1}\ngarbage\n{"step": 2}\n')
    with pytest.raises(BadInput) as e:
        read_metrics(p)
    assert "line 2" in one_line(e)


# ----------------------------------------------------------------------------- checkpoints


def test_checkpoint_round_trip(tmp_path):
    state = make_state(2.0)
    with Checkpointer(tmp_path / "ck", keep=3) as ck:
        assert ck.latest_step() is None and ck.all_steps() == []
        path = ck.save(10, state, {"step": 10, "note": "hi"})
        assert path == tmp_path / "ck" / "10" and path.is_dir()
        restored, meta = ck.restore(10, make_state(0.0))
    assert meta == {"step": 10, "note": "hi"}
    assert_same(restored, state)
    assert restored["step"] == 12
    assert isinstance(restored["params"]["dense"]["kernel"], jax.Array)
    assert jax.dtypes.issubdtype(restored["typed_rng"].dtype, jax.dtypes.prng_key)


def test_restore_onto_abstract_target_keeps_sharding(tmp_path):
    state = {"w": jnp.arange(8.0).reshape(2, 4), "b": jnp.ones(4)}
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), state)
    with Checkpointer(tmp_path, keep=1) as ck:
        ck.save(1, state)
        restored, meta = ck.restore(None, target)
    assert meta == {}
    assert restored["w"].sharding == sharding
    np.testing.assert_array_equal(restored["w"], state["w"])


def test_keep_last_n_and_overwrite(tmp_path):
    with Checkpointer(tmp_path, keep=2) as ck:
        for s in (1, 2, 3, 4):
            ck.save(s, make_state(float(s)), {"step": s})
        assert ck.all_steps() == [3, 4] and ck.latest_step() == 4
        assert sorted(os.listdir(tmp_path)) == ["3", "4"]
        ck.save(4, make_state(9.0), {"step": 4, "again": True})  # same step: replaced
        state, meta = ck.restore(4, make_state())
    assert meta["again"] is True and float(state["params"]["log_std"][0]) == -9.0
    with pytest.raises(BadInput):
        Checkpointer(tmp_path, keep=0)


def test_delete_after(tmp_path):
    with Checkpointer(tmp_path, keep=5) as ck:
        for s in (1, 2, 3):
            ck.save(s, make_state(), {})
        assert ck.delete_after(1) == [2, 3]
        assert ck.all_steps() == [1]


def test_missing_empty_and_unknown_step(tmp_path):
    target = make_state()
    with pytest.raises(BadInput) as e:
        Checkpointer(tmp_path / "nope").restore(None, target)
    assert "does not exist" in one_line(e)
    assert not (tmp_path / "nope").exists()  # reading never creates the folder
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadInput) as e:
        Checkpointer(tmp_path / "empty").restore(None, target)
    assert "no checkpoint" in one_line(e)
    with Checkpointer(tmp_path / "ck") as ck:
        ck.save(5, target)
        with pytest.raises(BadInput) as e:
            ck.restore(6, target)
    assert "step 6" in one_line(e) and "available steps: 5" in str(e.value)


def _state_files(step_dir: Path, pattern: str) -> list[Path]:
    return [p for p in (step_dir / "state").rglob(pattern) if p.is_file()]


# Orbax's async internals print "Event loop is closed" from a thread after some failed reads.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("damage", ["truncate_data", "delete_data", "truncate_manifest", "truncate_meta", "delete_state"])
def test_corrupt_checkpoint_is_bad_input(tmp_path, damage):
    with Checkpointer(tmp_path, keep=3) as ck:
        ck.save(1, make_state(1.0), {"step": 1})
        ck.save(2, make_state(2.0), {"step": 2})
    step_dir = tmp_path / "2"
    if damage == "truncate_data":
        files = [p for p in _state_files(step_dir, "*") if p.parent.name == "d"]
        for p in files:
            os.truncate(p, 3)
    elif damage == "delete_data":
        for p in [p for p in _state_files(step_dir, "*") if p.parent.name == "d"]:
            p.unlink()
    elif damage == "truncate_manifest":
        for p in _state_files(step_dir, "manifest.ocdbt"):
            os.truncate(p, 5)
    elif damage == "truncate_meta":
        os.truncate(step_dir / "meta" / "metadata", 3)
    elif damage == "delete_state":
        shutil.rmtree(step_dir / "state")
    with Checkpointer(tmp_path, keep=3) as ck, pytest.raises(BadInput) as e:
        ck.restore(2, make_state())
    msg = one_line(e)
    assert str(step_dir) in msg and "corrupt" in msg and "the newest checkpoint that verifies is step 1" in msg
    with Checkpointer(tmp_path, keep=3) as ck:  # the earlier step is untouched
        _, meta = ck.restore(1, make_state())
    assert meta == {"step": 1}


def _flip_a_kib(step_dir: Path) -> None:
    """Flips every bit of 1 KiB in the middle of the largest array data file."""
    data = max((p for p in _state_files(step_dir, "*") if p.parent.name == "d"), key=lambda p: p.stat().st_size)
    raw = bytearray(data.read_bytes())
    mid = len(raw) // 2
    raw[mid : mid + 1024] = bytes(b ^ 0xFF for b in raw[mid : mid + 1024])
    data.write_bytes(bytes(raw))


def test_a_bit_flipped_checkpoint_is_refused_and_the_verified_one_named(tmp_path):
    # Random values: orbax compresses its chunks, and a constant array would shrink to nothing.
    noise = np.random.default_rng(0).normal(size=(64, 256)).astype(np.float32)
    big = lambda v: {"w": jnp.asarray(noise + v), "step": jnp.int32(0)}  # noqa: E731
    with Checkpointer(tmp_path, keep=3) as ck:
        for s in (1, 2, 3):
            ck.save(s, big(float(s)), {"step": s})
    _flip_a_kib(tmp_path / "3")
    _flip_a_kib(tmp_path / "2")
    with Checkpointer(tmp_path, keep=3) as ck:
        with pytest.raises(BadInput) as e:
            ck.restore(None, big(0.0))
        msg = one_line(e)
        assert "checkpoint" in msg and str(tmp_path / "3") in msg and "fails its checksums" in msg
        assert "the newest checkpoint that verifies is step 1" in msg
        state, meta = ck.restore(1, big(0.0))
        assert meta == {"step": 1} and float(state["w"][0, 0]) == pytest.approx(noise[0, 0] + 1.0)
        assert ck.verified(1, big(0.0)) and not ck.verified(2, big(0.0))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32", "uint32", "int8", "bool"])
def test_checksums_are_the_same_on_the_host_and_on_devices(dtype):
    from rlinf_jax.runtime.checkpoint import _checksum, _checksum_np

    x = jnp.asarray(np.random.default_rng(0).normal(size=(7, 33)) * 50).astype(dtype)
    assert _checksum(x) == _checksum_np(np.asarray(x))
    y = np.asarray(x).copy()
    y.reshape(-1)[5], y.reshape(-1)[6] = y.reshape(-1)[6], y.reshape(-1)[5]  # a swap moves the weighted sum
    if y.reshape(-1)[5] != y.reshape(-1)[6]:
        assert _checksum_np(y)[1] != _checksum_np(np.asarray(x))[1]


@pytest.mark.parametrize("failure", ["disk_full", "interrupt"])
def test_a_save_that_fails_leaves_the_previous_checkpoint_the_latest(tmp_path, monkeypatch, failure):
    import errno

    import orbax.checkpoint as ocp

    with Checkpointer(tmp_path, keep=3) as ck:
        ck.save(1, make_state(1.0), {"step": 1})
        real = ocp.CheckpointManager.save

        def failing(self, *args, **kwargs):
            real(self, *args, **kwargs)  # the data is written, then the failure comes
            if failure == "disk_full":
                raise OSError(errno.ENOSPC, "No space left on device")
            raise KeyboardInterrupt

        monkeypatch.setattr(ocp.CheckpointManager, "save", failing)
        if failure == "disk_full":
            with pytest.raises(BadInput) as e:
                ck.save(2, make_state(2.0), {"step": 2})
            msg = one_line(e)
            assert "No space left on device" in msg and "latest complete checkpoint is step 1" in msg
        else:
            with pytest.raises(KeyboardInterrupt):
                ck.save(2, make_state(2.0), {"step": 2})
        monkeypatch.setattr(ocp.CheckpointManager, "save", real)
        assert ck.all_steps() == [1]
        state, meta = ck.restore(None, make_state())
    assert meta == {"step": 1}
    assert_same(state, make_state(1.0))


@pytest.mark.parametrize("change, key", [
    (lambda s: s["params"]["dense"].__setitem__("kernel", jnp.zeros((3, 9))), "params.dense.kernel"),
    (lambda s: s["params"].pop("log_std"), "params.log_std"),
    (lambda s: s["params"].__setitem__("extra", jnp.zeros(2)), "params.extra"),
    (lambda s: s["opt"][0].__setitem__("mu", jnp.zeros((3, 5))), "opt.0.mu"),
])
def test_shape_mismatch_names_the_key(tmp_path, change, key):
    with Checkpointer(tmp_path) as ck:
        ck.save(3, make_state())
        target = make_state()
        change(target)
        with pytest.raises(BadInput) as e:
            ck.restore(3, target)
    msg = one_line(e)
    assert key in msg and "does not fit" in msg


def test_shape_mismatch_shows_both_shapes(tmp_path):
    with Checkpointer(tmp_path) as ck:
        ck.save(1, make_state(hidden=4))
        with pytest.raises(BadInput) as e:
            ck.restore(1, make_state(hidden=8))
    msg = one_line(e)
    assert "(3, 4)" in msg and "(3, 8)" in msg


def test_partial_save_leftover_is_ignored(tmp_path):
    with Checkpointer(tmp_path, keep=3) as ck:
        ck.save(1, make_state(1.0), {"step": 1})
    # What a kill during orbax's write of step 2 leaves behind: a temp folder, never renamed.
    tmp = tmp_path / "2.orbax-checkpoint-tmp-1700000000000000"
    (tmp / "state").mkdir(parents=True)
    (tmp / "state" / "_METADATA").write_text('{"tree_metad')
    assert list_steps(tmp_path) == [1]
    with Checkpointer(tmp_path, keep=3) as ck:
        assert ck.latest_step() == 1 and ck.all_steps() == [1]
        state, meta = ck.restore(None, make_state())
        assert meta == {"step": 1}
        assert_same(state, make_state(1.0))
        assert tmp.exists()  # reading leaves it alone: it could be a live writer's
        ck.save(2, make_state(2.0), {"step": 2})  # the same step saves cleanly over it
        assert ck.latest_step() == 2
        assert not tmp.exists()  # the writer sweeps leftovers
        assert ck.restore(2, make_state())[1] == {"step": 2}


def test_save_is_complete_when_it_returns(tmp_path):
    # The child dies the instant save() returns: no close(), no atexit handlers.
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(REPO)!r})
        import jax.numpy as jnp
        from rlinf_jax.runtime import Checkpointer
        ck = Checkpointer({str(tmp_path)!r}, keep=2)
        ck.save(7, {{"w": jnp.arange(1000.0)}}, {{"step": 7}})
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    with Checkpointer(tmp_path) as ck:
        state, meta = ck.restore(None, {"w": jnp.zeros(1000)})
    assert meta == {"step": 7} and float(state["w"][-1]) == 999.0


# ----------------------------------------------------------------------------- resume


def test_resolve_resume(tmp_path):
    cfg = cfg_in(tmp_path)
    rd = RunDir.create(cfg)
    assert resolve_resume(cfg, rd) is None
    assert resolve_resume(cfg_in(tmp_path, "runner.resume=auto"), rd) is None  # fresh start

    with Checkpointer(rd.checkpoints, keep=3) as ck:
        ck.save(10, make_state(), {"step": 10})
        ck.save(20, make_state(), {"step": 20})
    assert rd.has_checkpoints()

    auto = resolve_resume(cfg_in(tmp_path, "runner.resume=auto"), rd)
    assert auto == ResumePoint(rd.checkpoints.absolute(), 20)
    ckpt_dir, step = auto  # unpacks
    assert step == 20 and auto.path == rd.checkpoints.absolute() / "20"

    assert resolve_resume(cfg_in(tmp_path, f"runner.resume={rd.checkpoints / '10'}"), rd).step == 10
    assert resolve_resume(cfg_in(tmp_path, f"runner.resume={rd.checkpoints}"), rd).step == 20
    assert resolve_resume(cfg_in(tmp_path, f"runner.resume={rd.path}"), rd).step == 20

    state, meta = restore_checkpoint(rd.checkpoints / "10", make_state())
    assert meta == {"step": 10}


def test_resolve_resume_bad_paths(tmp_path):
    cfg = cfg_in(tmp_path)
    rd = RunDir.create(cfg)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BadInput) as e:
        resolve_resume(cfg_in(tmp_path, f"runner.resume={empty}"), rd)
    assert "no finished checkpoint" in one_line(e)
    # A path that vanished after the config was loaded.
    gone = cfg_in(tmp_path, f"runner.resume={empty}")
    empty.rmdir()
    with pytest.raises(BadInput) as e:
        resolve_resume(gone, rd)
    assert "no such path" in one_line(e)


def test_zero_size_arrays_round_trip(tmp_path):
    # MJX states carry zero-size arrays (no contacts); orbax alone hangs on them.
    from rlinf_jax.runtime import Checkpointer

    state = {"empty": np.zeros((4, 0, 3), np.float32), "ids": np.zeros((0,), np.int32), "x": np.arange(3.0)}
    ckpt = Checkpointer(tmp_path / "ckpt", keep=2)
    ckpt.save(1, state)
    restored, _ = ckpt.restore(1, state)
    assert restored["empty"].shape == (4, 0, 3) and restored["ids"].dtype == np.int32
    np.testing.assert_array_equal(restored["x"], state["x"])
