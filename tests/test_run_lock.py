"""One writer per run folder (`rlinf_jax.runtime.run_lock`): a second writer is refused in one
line naming the holder, the lock goes with its holder however it ends (a lock file left by a
killed run is taken over), and a refused run leaves no folder behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from rlinf_jax.errors import BadInput
from rlinf_jax.runtime.run_lock import LOCK_FILE, RunLock, lock_run_folder, read_holder

# A process that holds a run folder's lock until it is killed (or its stdin closes).
HOLDER = """
import sys
from rlinf_jax.runtime.run_lock import RunLock
lock = RunLock(sys.argv[1])
lock.acquire()
print("held", flush=True)
sys.stdin.read()
lock.release()
"""


def _holder(run_dir):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    run = tmp_path / "runs" / "r"
    proc = _holder(run)
    try:
        with pytest.raises(BadInput) as e:
            lock_run_folder(run)
        msg = str(e.value)
        assert f"is in use by pid {proc.pid} on host {socket.gethostname()}" in msg
        assert "choose another runner.experiment_name" in msg and "\n" not in msg
        info = read_holder(run)
        assert info["pid"] == proc.pid and "-c" in info["command"]
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
    # Released on a clean exit: the file is gone and the folder can be had.
    assert not (run / LOCK_FILE).exists()
    with lock_run_folder(run):
        assert read_holder(run)["pid"] == os.getpid()
    assert not (run / LOCK_FILE).exists()


def test_a_killed_holder_leaves_a_stale_lock_that_is_taken_over(tmp_path):
    run = tmp_path / "r"
    proc = _holder(run)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert read_holder(run)["pid"] == proc.pid  # the file outlives its holder ...
    t0 = time.monotonic()
    with lock_run_folder(run):  # ... but not the lock: no waiting, no question asked
        assert read_holder(run)["pid"] == os.getpid()
    assert time.monotonic() - t0 < 5


def test_one_process_cannot_hold_a_folder_twice(tmp_path):
    # Record locks never conflict within a process: the module keeps its own account.
    with lock_run_folder(tmp_path / "r"):
        with pytest.raises(BadInput, match="in use by another run of this process"):
            lock_run_folder(tmp_path / "r")
        assert read_holder(tmp_path / "r")["pid"] == os.getpid()  # the refusal did not release it
    with lock_run_folder(tmp_path / "r"):
        pass


def test_a_refused_run_leaves_no_folder_it_created(tmp_path):
    run = tmp_path / "out" / "deep" / "r"
    lock = RunLock(run)
    lock.acquire()
    assert run.is_dir()
    lock.release()
    assert not (tmp_path / "out").exists()  # made by the acquire, empty: removed
    # A folder that holds anything stays, and so does one that was there before.
    (tmp_path / "kept").mkdir()
    with lock_run_folder(tmp_path / "kept" / "r") as lock:
        (lock.run_dir / "metrics.jsonl").write_text("")
    assert (tmp_path / "kept" / "r" / "metrics.jsonl").is_file() and not (tmp_path / "kept" / "r" / LOCK_FILE).exists()


def test_a_file_in_the_way_is_one_line(tmp_path):
    (tmp_path / "r").write_text("")
    with pytest.raises(BadInput, match="a file is in the way"):
        lock_run_folder(tmp_path / "r")


def test_a_disabled_lock_touches_nothing(tmp_path):
    # What the non-primary processes of a multi-host job hold: nothing (process 0 holds it).
    with lock_run_folder(tmp_path / "r", primary=False):
        assert not (tmp_path / "r").exists()


def test_the_holder_file_is_json_naming_pid_host_start_and_command(tmp_path):
    with lock_run_folder(tmp_path / "r"):
        info = json.loads((tmp_path / "r" / LOCK_FILE).read_text())
    assert set(info) == {"pid", "host", "started", "command"}
    assert info["pid"] == os.getpid() and info["host"] == socket.gethostname()
