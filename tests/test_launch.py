"""The multi-host launcher, with local processes standing in for hosts.

Each "host" is a process with 4 fake CPU devices; the reference is one process with 8
(collocated: a disaggregated run gives the same numbers, tests/test_flow.py).
The same seed and config must give the same numbers (up to float summation order, which
differs between one process and gloo collectives across two), also when a process is
SIGKILLed mid-run and the job restarts from its checkpoint; impossible cluster settings
must end in one error line. Two runs of two hosts are all the file can afford (each
compiles in both processes on a 2-core machine), so the killed run is the disaggregated
one: its state crosses hosts in every iteration and in every checkpoint.

The Ray cluster is started once for the module (in this process) and joined by every
launcher through ``--address``; one test starts the launcher's own local instance.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest

from rlinf_jax.runtime import read_metrics
from tests.conftest import TINY, clean_env, forced_devices_env, run_child

# One local Ray instance at a time: with pytest-xdist (--dist loadgroup) these tests share a worker.
# Several JAX processes (a multi-host run on this machine): the multiprocess tier.
pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.multiprocess]

# 8 iterations of 16 envs x 16 steps, a checkpoint every 2: enough to kill a process after
# the first checkpoint and before the end.
RUN = [
    *TINY,
    "runner.max_steps=8",
    "runner.save_interval=2",
    "runner.log_interval=2",
    "runner.eval_interval=4",
]
DISAGGREGATED = ["cluster.component_placement=disaggregated"]


def _launch_argv(address, *args, hosts=2, devices=4):
    argv = [sys.executable, "-m", "rlinf_jax.launch", "--num-hosts", str(hosts)]
    if devices is not None:
        argv += ["--devices-per-host", str(devices)]
    if address is not None:
        argv += ["--address", address]
    return argv + list(args)


def _launch(address, *args, hosts=2, devices=4, timeout=600, env=None):
    return subprocess.run(
        _launch_argv(address, *args, hosts=hosts, devices=devices),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or clean_env(),
    )


def _one_host(out_dir, name) -> Path:
    """The reference: one process with 8 fake devices, the plain training entry point."""
    proc = subprocess.run(
        [sys.executable, "-m", "rlinf_jax.train", *RUN, f"runner.output_dir={out_dir}", f"runner.experiment_name={name}"],
        capture_output=True,
        text=True,
        timeout=600,
        env=forced_devices_env(8),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return Path(out_dir) / name


def _numbers(run_dir):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in read_metrics(run_dir)]


def _assert_close(got, ref):
    assert [r["step"] for r in got] == [r["step"] for r in ref]
    for a, b in zip(got, ref):
        assert a.keys() == b.keys(), a.keys() ^ b.keys()
        for key, value in b.items():
            # Gradients are summed over 8 devices in another order across two processes;
            # that drift (~1e-6 relative) is all that may differ. A wrong env split, key
            # or placement shows as O(1) differences.
            np.testing.assert_allclose(a[key], value, rtol=1e-3, atol=1e-4, err_msg=f"step {a['step']} {key}")


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.fixture(scope="module")
def ray_address():
    """A Ray cluster for the module: one node with 4 logical CPUs, bound to localhost."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        mp.setenv("RAY_USAGE_STATS_ENABLED", "0")
        import logging

        import ray

        info = ray.init(num_cpus=4, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
        try:
            yield info.address_info["gcs_address"]
        finally:
            ray.shutdown()


@pytest.fixture(scope="module")
def one_host(tmp_path_factory):
    """The reference of both two-host runs below: one process, 8 fake devices, collocated.
    A disaggregated run gives its numbers up to float summation order (tests/test_flow.py),
    so one reference serves both layouts."""
    return _one_host(tmp_path_factory.mktemp("reference"), "one_host")


def _without_flow(records):
    # The staged runner's own staleness statistics (flow/*), which a collocated run has not.
    return [{k: v for k, v in r.items() if not k.startswith("flow/")} for r in records]


# ------------------------------------------------------------------ same numbers
@pytest.mark.slow
def test_two_hosts_match_one_host_collocated(ray_address, one_host, tmp_path):
    proc, lag = run_child("launch", _launch_argv(ray_address, *RUN, f"runner.output_dir={tmp_path}",
                                                 "runner.experiment_name=two_hosts")[3:], tmp_path, env=clean_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert lag is not None and lag < 15, lag  # the launcher exits within seconds of its last line
    run_dir = tmp_path / "two_hosts"
    _assert_close(_numbers(run_dir), _numbers(one_host))
    assert "done: 8 iterations" in proc.stdout  # process 0's summary reaches the launcher's stdout
    assert proc.stdout.count("done:") == 1  # ... and only process 0's

    placement = json.loads((run_dir / "placement.json").read_text())
    assert placement["mode"] == "collocated"
    assert placement["components"]["actor"]["devices"] == list(range(8))  # devices of both hosts
    # Process 0 alone writes TensorBoard (one event file); both write checkpoint shards.
    assert len(list((run_dir / "tensorboard").glob("events.*"))) == 1
    state = run_dir / "checkpoints" / "8" / "state"
    assert {p.name for p in state.glob("ocdbt.process_*")} == {"ocdbt.process_0", "ocdbt.process_1"}


# ------------------------------------------------------------------ fault tolerance
def _worker_pid(out_dir, experiment: str, process_id: int) -> int | None:
    """The pid of one training process of a launch, found through /proc."""
    marks = (b"--worker", f"runner.experiment_name={experiment}".encode(), f"runner.output_dir={out_dir}".encode())
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            if not all(m in argv for m in marks):
                continue
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RLINF_PROCESS_ID={process_id}".encode() in env:
            return int(entry)
    return None


def _launcher_lines(stderr: str) -> str:
    """The launcher's own lines and the first lines of each traceback, for a failure message."""
    keep, in_traceback = [], False
    for line in stderr.splitlines():
        if line.startswith("Traceback"):
            in_traceback = True
        if in_traceback or line.startswith(("launch:", "error:")):
            keep.append(line)
        if in_traceback and line and not line.startswith(" ") and not line.startswith("Traceback"):
            in_traceback = False  # the exception line ends the traceback
    return "\n".join(keep[-60:])


@pytest.mark.slow
def test_disaggregated_run_killed_mid_run_restarts_and_matches_one_host(ray_address, one_host, tmp_path):
    # The actor sits on the second host, env and rollout on the first: trajectories and
    # weights cross hosts every iteration, and the actor's state reaches the checkpoint
    # through the host. Process 1 (the actor's host) is SIGKILLed after the first
    # checkpoint; the job must restart from it and end with the numbers of an
    # uninterrupted run (the one-host run, up to float summation order).
    out, err = tmp_path / "launch.out", tmp_path / "launch.err"
    with open(out, "w") as fo, open(err, "w") as fe:
        launcher = subprocess.Popen(
            _launch_argv(ray_address, *RUN, *DISAGGREGATED, f"runner.output_dir={tmp_path}", "runner.experiment_name=two_hosts"),
            stdout=fo,
            stderr=fe,
            text=True,
            env=clean_env(),
        )
        ckpts = tmp_path / "two_hosts" / "checkpoints"
        deadline = time.time() + 400
        victim = None
        while time.time() < deadline and launcher.poll() is None:
            # A step is complete once its checksums are written; a save the kill cuts off
            # is dropped and would leave nothing to resume from.
            if ckpts.is_dir() and any(p.name.isdigit() and (p / "checksums.json").is_file() for p in ckpts.iterdir()):
                victim = _worker_pid(tmp_path, "two_hosts", 1)
                if victim is not None:
                    break
            time.sleep(0.05)
        assert victim is not None, "no checkpoint before the run ended"
        os.kill(victim, signal.SIGKILL)
        killed_after = max(int(p.name) for p in ckpts.iterdir() if p.name.isdigit() and (p / "checksums.json").is_file())
        launcher.wait(timeout=600)
    stderr = err.read_text()
    assert launcher.returncode == 0, stderr[-3000:]
    assert killed_after < 8
    # A start that fails under load (a timed-out coordinator connection) is restarted as
    # well, so the kill's restart need not be the first.
    assert re.search(r"restart [12]/2: process 1 was killed by SIGKILL", stderr), _launcher_lines(stderr)
    assert "resumed from step" in out.read_text()
    run_dir = tmp_path / "two_hosts"
    got = _numbers(run_dir)
    _assert_close(_without_flow(got), _numbers(one_host))
    # Synchronous: the rollout always acts with the newest weights, across the restart too.
    assert all(r.get("flow/staleness_max", 0.0) == 0.0 for r in got) and "flow/staleness_max" in got[-1]

    placement = json.loads((run_dir / "placement.json").read_text())
    assert placement["mode"] == "disaggregated" and (placement["runner"], placement["algorithm"]) == ("Staged", "PPO")
    assert placement["components"]["actor"]["devices"] == [4, 5, 6, 7]  # the second host's
    assert placement["components"]["env"]["devices"] == [0, 1]


# ------------------------------------------------------------------ bad settings
def test_more_hosts_than_a_local_ray_instance_holds(tmp_path):
    # No --address: the launcher starts its own Ray instance, which never grows.
    hosts = (os.cpu_count() or 1) + 1
    proc = _launch(None, *TINY, f"runner.output_dir={tmp_path}", hosts=hosts, devices=1, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = _error_lines(proc.stderr)
    assert len(errors) == 1 and f"--num-hosts={hosts}" in errors[0], proc.stderr
    assert not (tmp_path / "ppo_brax_inverted_pendulum").exists()


def test_hosts_a_cluster_cannot_place_in_time(ray_address, tmp_path):
    # The module's cluster has 4 CPUs: 5 bundles of 1 CPU never become ready.
    t0 = time.time()
    proc = _launch(ray_address, "--placement-timeout", "2", *TINY, f"runner.output_dir={tmp_path}", hosts=5, devices=1)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = _error_lines(proc.stderr)
    assert len(errors) == 1 and "could not place 5 hosts" in errors[0], proc.stderr
    assert time.time() - t0 < 120


def test_placement_beyond_the_global_device_count(tmp_path):
    # 2 hosts x 4 devices = 8 devices: rank 9 does not exist. Known before Ray starts.
    proc = _launch(
        None, *TINY, "cluster.component_placement={env: 0-3, rollout: 4-7, actor: 0-9}", f"runner.output_dir={tmp_path}"
    )
    assert proc.returncode == 2, proc.stderr
    errors = _error_lines(proc.stderr)
    assert len(errors) == 1 and "device rank 8 is out of range; 8 device(s) exist" in errors[0], proc.stderr


@pytest.mark.slow
def test_placement_beyond_the_devices_the_processes_find(ray_address, tmp_path):
    # Without --devices-per-host only the processes know their devices (4 each here,
    # through XLA_FLAGS); both reject the placement, the launcher shows one line.
    argv = _launch_argv(ray_address, *TINY, "cluster.component_placement={env: 0-3, rollout: 4-7, actor: 0-11}",
                        f"runner.output_dir={tmp_path}", devices=None)
    proc, lag = run_child("launch", argv[3:], tmp_path, env=forced_devices_env(4))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert lag is not None and lag < 15, lag  # the launcher exits within seconds of its error line
    errors = _error_lines(proc.stderr)
    assert len(errors) == 1 and "device rank 8 is out of range; 8 device(s) exist" in errors[0], proc.stderr
    assert "restart" not in proc.stderr  # bad input is not retried


# ------------------------------------------------------------------ launcher pieces
def test_restart_resumes_from_this_runs_latest_checkpoint(tmp_path):
    from rlinf_jax.config import load_config
    from rlinf_jax.launch import _resume_overrides
    from rlinf_jax.runtime import Checkpointer

    cfg = load_config("ppo_brax", [f"runner.output_dir={tmp_path}", "runner.experiment_name=r"])
    assert _resume_overrides(["env.num_envs=16", "runner.resume=none"], cfg) == ["env.num_envs=16", "runner.resume=auto"]
    # Started from another run's checkpoint: that start holds until this run saved its own.
    cfg.runner.resume = str(tmp_path / "elsewhere" / "checkpoints" / "4")
    given = [f"runner.resume={cfg.runner.resume}"]
    assert _resume_overrides(given, cfg) == given
    Checkpointer(tmp_path / "r" / "checkpoints").save(2, {"x": np.zeros(2, np.float32)})
    assert _resume_overrides(given, cfg) == ["runner.resume=auto"]


def test_bundles_per_node_and_exit_descriptions():
    from rlinf_jax.launch import _describe_exit, _fits

    bundle = {"CPU": 2.0, "GPU": 1.0}
    assert _fits(bundle, {"CPU": 8.0, "GPU": 2.0, "memory": 1e9}) == 2  # GPUs run out first
    assert _fits(bundle, {"CPU": 8.0}) == 0
    assert _describe_exit(1, -signal.SIGKILL) == "process 1 was killed by SIGKILL"
    assert _describe_exit(0, 70) == "process 0 crashed"


def test_worker_environment(monkeypatch):
    from rlinf_jax.launch import _parse_args, _worker_env

    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_dump_to=/tmp/x")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # Ray's to set per bundle, never forwarded
    args = _parse_args(["--num-hosts", "2", "--devices-per-host", "4", "--env", "FOO=a=b", "env.num_envs=16"])
    env = _worker_env(args, 2, 1, "10.0.0.7:4567")
    assert env["XLA_FLAGS"] == "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=4"
    assert env["JAX_PLATFORMS"] == "cpu" and env["FOO"] == "a=b" and "CUDA_VISIBLE_DEVICES" not in env
    assert (env["RLINF_COORDINATOR_ADDRESS"], env["RLINF_NUM_PROCESSES"], env["RLINF_PROCESS_ID"]) == ("10.0.0.7:4567", "2", "1")
    assert args.overrides == ["env.num_envs=16"]



class _FakeHost:
    """Stands in for a host actor: ``poll.remote()`` answers a fixed exit code."""

    def __init__(self, code):
        self.poll = types.SimpleNamespace(remote=lambda: code)


_FAKE_RAY = types.SimpleNamespace(
    get=lambda values, timeout=None: values, exceptions=types.SimpleNamespace(RayError=RuntimeError)
)


@pytest.mark.parametrize(
    "seen, final, expected",
    [
        # process 0 crashed on a broken collective after process 1 was SIGKILLed
        ([70, None], [70, -signal.SIGKILL], (1, -signal.SIGKILL)),
        # process 0 rejected its input; process 1 aborted when the coordinator left
        ([2, None], [2, -signal.SIGABRT], (0, 2)),
        # nothing deliberate and nothing killed from outside: the first failure seen
        ([None, -signal.SIGABRT], [70, -signal.SIGABRT], (1, -signal.SIGABRT)),
    ],
)
def test_root_cause_prefers_deliberate_exits_then_outside_kills(seen, final, expected):
    from rlinf_jax.launch import Launcher

    launcher = Launcher.__new__(Launcher)
    launcher.ray = _FAKE_RAY
    hosts = [_FakeHost(code) for code in final]
    assert launcher.root_cause(hosts, list(seen), grace_s=1.0) == expected


class _IdleHost:
    """A host actor whose process runs on but has made no progress for ``idle`` seconds."""

    def __init__(self, idle):
        self.poll = types.SimpleNamespace(remote=lambda: None)
        self.take_output = types.SimpleNamespace(remote=lambda: [])
        self.idle_seconds = types.SimpleNamespace(remote=lambda: idle)


def test_a_process_that_makes_no_progress_counts_as_hung_and_is_restarted():
    from rlinf_jax.config import load_config
    from rlinf_jax.launch import EXIT_CRASHED, Launcher

    launcher = Launcher.__new__(Launcher)
    launcher.ray = _FAKE_RAY
    launcher.cfg = load_config("ppo_brax", ["cluster.hang_timeout_s=30"])
    launcher.out = launcher.err = sys.stderr
    launcher.liveness_every_s = 0.0  # check at every poll
    hosts = [_IdleHost(1.0), _IdleHost(45.0)]
    assert launcher.hung(hosts, [None, None], 30.0).cause.startswith("process 1 made no progress for 45 s")
    assert launcher.hung([_IdleHost(1.0), _IdleHost(2.0)], [None, None], 30.0) is None
    outcome = launcher.watch(hosts)  # both still running: only the liveness check can end the watch
    assert outcome.code == EXIT_CRASHED and outcome.retryable and "cluster.hang_timeout_s=30" in outcome.cause


def test_the_heartbeat_marks_progress(tmp_path, monkeypatch):
    from rlinf_jax.runtime.distributed import ENV_HEARTBEAT, heartbeat

    beat = tmp_path / "beat"
    monkeypatch.setenv(ENV_HEARTBEAT, str(beat))
    heartbeat()
    first = beat.stat().st_mtime
    os.utime(beat, (first - 100, first - 100))
    heartbeat()
    assert beat.stat().st_mtime >= first
