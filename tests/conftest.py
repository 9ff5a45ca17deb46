"""Shared test settings: tiny training configs, a subprocess runner for the CLI, and the
harness that runs a test on several fake CPU devices.

``@pytest.mark.devices(n)`` runs the marked test in a child pytest whose JAX sees ``n``
host CPU devices (the count is fixed when JAX starts, so it cannot change inside this
process). The test itself is ordinary code; in this process it passes when the child's
run of it passes, and fails with the child's output when it does not.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rlinf_jax.envs.mjx_import import import_mjx

# One persistent JAX compilation cache for the whole test session, every xdist worker and
# every child process included (they inherit the environment): many tests compile the
# same small programs, and a cached executable computes exactly what a fresh compile does.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", str(Path(tempfile.gettempdir()) / f"rlinf_jax_test_cache_{os.getuid()}")
)

# Set in a child started for a test marked `optimized`: it compiles as users do.
CHILD_OPTIMIZED = "RLINF_TEST_OPTIMIZED"
OPTIMIZED = os.environ.get(CHILD_OPTIMIZED) == "1"

# Test processes compile with LLVM's optimisation off: the suite compiles thousands of small
# programs and runs most for a few steps, so the backend's optimisation is most of a compile
# and buys nothing back. XLA's own (HLO) passes still run, and every comparison in the suite
# is between programs compiled alike. A test that trains long enough for the optimisation to
# pay for itself (a learning claim: 2-3x faster steps) is marked `optimized` and runs in a
# child process compiling as users do. Tests of the flags themselves set XLA_FLAGS.
TEST_XLA_FLAGS = "" if OPTIMIZED else "--xla_backend_optimization_level=0"
if TEST_XLA_FLAGS and TEST_XLA_FLAGS not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()

# No test steps an env through MJX's Warp backend: every test process (workers and the
# children of the devices marker) imports MJX without it, seconds sooner (envs/mjx_import.py).
import_mjx(warp=False)

# Small enough to compile and run in seconds on a 2-core CPU, big enough to learn a little.
TINY = [
    "env.num_envs=16",
    "env.num_eval_envs=16",
    "env.episode_length=200",
    "algorithm.rollout_length=16",
    "algorithm.num_minibatches=4",
    "algorithm.update_epochs=2",
    "actor.model.policy_hidden_sizes=[16,16]",
    "actor.model.value_hidden_sizes=[32,32]",
    "runner.progress_bar=false",
]

# Set in a child started by the `devices` marker: the device count it was started with.
CHILD_DEVICES = "RLINF_TEST_DEVICES"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def tiny(tmp_path):
    """Overrides for a tiny inverted_pendulum run writing under tmp_path."""
    return [*TINY, f"runner.output_dir={tmp_path}", "runner.experiment_name=t"]


def run_cli(args, env_extra=None, **kwargs):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "rlinf_jax.train", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        **kwargs,
    )


def run_child(entry: str, args, tmp_path, fault: str | None = None, fault_at: int = 2, timeout: float = 600,
              env: dict | None = None, fault_where: str = ""):
    """``python -m rlinf_jax.<entry> args`` in a child process (`tests/child_main.py`), with an
    optional fault (``fault_where="thread"``: from inside orbax's background thread);
    returns ``(completed process, seconds between main returning and the process
    exiting)``; the lag is None when main never returned (a crash)."""
    marker = Path(tmp_path) / f"returned.{os.getpid()}.{time.monotonic_ns()}"
    env = {**(os.environ if env is None else env), "RLINF_TEST_FAULT": fault or "", "RLINF_TEST_FAULT_AT": str(fault_at),
           "RLINF_TEST_FAULT_WHERE": fault_where}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "child_main.py"), str(marker), entry, *args],
        capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT,
    )
    ended = time.time()
    lag = ended - float(marker.read_text()) if marker.is_file() else None
    return proc, lag


def clean_env(**extra) -> dict:
    """This process's environment without the settings that pick devices or a Ray cluster
    (its test flags kept: the children of an `optimized` test compile as users do too)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "XLA_FLAGS", "JAX_PLATFORMS", CHILD_DEVICES, CHILD_OPTIMIZED)}
    return {**env, "XLA_FLAGS": TEST_XLA_FLAGS, **extra}


def forced_devices_env(n: int, **extra) -> dict:
    """The environment of a process whose JAX sees ``n`` CPU devices."""
    flags = f"--xla_force_host_platform_device_count={n} {TEST_XLA_FLAGS}".strip()
    return clean_env(XLA_FLAGS=flags, JAX_PLATFORMS="cpu", **extra)


def pytest_configure(config):
    config.addinivalue_line("markers", "devices(n): run the test in a child pytest that sees n fake CPU devices")
    config.addinivalue_line(
        "markers", "optimized: run the test in a child pytest that compiles with XLA's full optimisation")


def pytest_collection_modifyitems(config, items):
    # The fast tier: every test that is neither slow nor multiprocess is a unit test.
    for item in items:
        if item.get_closest_marker("slow") is None and item.get_closest_marker("multiprocess") is None:
            item.add_marker(pytest.mark.unit)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    devices = pyfuncitem.get_closest_marker("devices")
    optimized = pyfuncitem.get_closest_marker("optimized") is not None
    if devices is None and not optimized:
        return None
    n = None if devices is None else int(devices.args[0])
    if (n is None or os.environ.get(CHILD_DEVICES) == str(n)) and (not optimized or OPTIMIZED):
        return None  # this is the child: run the test here
    flags = (n is not None and f"--xla_force_host_platform_device_count={n}", not optimized and TEST_XLA_FLAGS)
    env = clean_env(XLA_FLAGS=" ".join(f for f in flags if f))
    if n is not None:
        env.update(JAX_PLATFORMS="cpu", **{CHILD_DEVICES: str(n)})
    if optimized:
        env[CHILD_OPTIMIZED] = "1"
    # Without pytest's unraisable-exception plugin: at exit it runs five full garbage
    # collections over the child's JAX heap (1.4-2.1 s measured), to turn exceptions raised in
    # finalizers into warnings that nobody reads here; the child's result is its exit code.
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:unraisableexception",
         pyfuncitem.nodeid],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=(devices.kwargs if devices is not None else {}).get("timeout", 1500),
    )
    if proc.returncode != 0:
        where = " and ".join(w for w in (n is not None and f"{n} devices", optimized and "XLA's full optimisation") if w)
        pytest.fail(f"failed with {where}:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}", pytrace=False)
    return True
