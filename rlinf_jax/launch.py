"""`python -m rlinf_jax.launch --num-hosts N [options] [train arguments]`: one JAX process per host.

Ray places and supervises the job. A placement group holds one bundle per host
(STRICT_SPREAD over the nodes of a multi-node cluster: one process per machine; PACK
when everything is on one machine), and in each bundle a small actor starts that host's
training process, reports its output and exit, and kills it on request. Every process
joins one JAX job (`runtime.distributed`; the coordinator listens on process 0's host)
and runs `python -m rlinf_jax.train` with the same arguments, so the meshes span the
devices of all hosts.

If a process dies, the launcher stops the others, waits until Ray can place the job
again and restarts it from the latest checkpoint (``runner.resume=auto``), up to
``cluster.max_restarts`` times. Errors in the arguments, the config or the cluster
(more hosts than Ray can place, a placement beyond the global device count) end with
one ``error:`` line and exit code 2, as in `rlinf_jax.train`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass

from rlinf_jax.crash import EXIT_CRASHED
from rlinf_jax.errors import BadInput

# Exit codes of a training process (`python -m rlinf_jax.launch --worker`). Only a crash
# (EXIT_CRASHED, 70) is worth a restart: bad input, divergence and Ctrl-C would only happen again.
EXIT_OK, EXIT_DIVERGED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
FINAL_EXITS = (EXIT_DIVERGED, EXIT_BAD_INPUT, EXIT_INTERRUPTED)

# Launcher-side variables that the training processes inherit (Ray's workers would
# otherwise run with the environment their node's raylet was started with).
FORWARDED_PREFIXES = ("JAX_", "XLA_", "NCCL_", "TF_CPP_", "LIBTPU_")
ENV_PARENT_PID = "RLINF_LAUNCH_PARENT_PID"
STRATEGIES = ("auto", "STRICT_SPREAD", "SPREAD", "PACK", "STRICT_PACK")
_DEVICE_COUNT_FLAG = re.compile(r"--xla_force_host_platform_device_count=\S+")
# gloo reports every connection it makes, from several threads at once (lines come torn).
_GLOO_CHATTER = re.compile(r"\[Gloo\]|connected to \d+ peer ranks|Expected number of connected peer ranks")


def _chatter(line: str) -> bool:
    return bool(_GLOO_CHATTER.search(line))


def _parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m rlinf_jax.launch",
        description="Train across hosts: one JAX process per host, placed and restarted by Ray. Every "
        "argument of `python -m rlinf_jax.train` is accepted and passed on.",
    )
    parser.add_argument("--num-hosts", type=int, default=1, help="processes to start, one per host (default: 1)")
    parser.add_argument(
        "--address",
        default=None,
        help="Ray cluster to join (host:port, ray://host:port or auto); default: $RAY_ADDRESS, else a "
        "local Ray instance bound to 127.0.0.1",
    )
    parser.add_argument("--cpus-per-host", type=float, default=1.0, help="CPUs a process reserves (default: 1)")
    parser.add_argument("--gpus-per-host", type=float, default=0.0, help="GPUs a process reserves (default: 0)")
    parser.add_argument(
        "--resources-per-host", default="{}", metavar="JSON", help="other Ray resources a process reserves, e.g. '{\"TPU\": 4}'"
    )
    parser.add_argument(
        "--devices-per-host",
        type=int,
        default=None,
        help="simulate hosts on CPUs: each process gets this many fake CPU devices (testing)",
    )
    parser.add_argument(
        "--strategy",
        default="auto",
        choices=STRATEGIES,
        help="placement group strategy; auto: STRICT_SPREAD on a multi-node cluster, PACK on one node",
    )
    parser.add_argument(
        "--placement-timeout", type=float, default=120.0, help="seconds to wait for Ray to place the hosts (default: 120)"
    )
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="extra environment for every process")
    parser.add_argument("--log-dir", default=None, help="also write each process's output to <log-dir>/process_<i>.log on its host")
    parser.add_argument(
        "--worker",
        action="store_true",
        help="be one host's process of a job started by other means (every worker of a TPU pod slice, SLURM): "
        "the job comes from the RLINF_* variables or JAX's cluster detection",
    )
    parser.add_argument("--config-name", "-cn", default="ppo_brax", help="recipe in configs/ (default: ppo_brax)")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    return parser.parse_intermixed_args(argv)


# --------------------------------------------------------------------- the worker side
def _exit_when_orphaned() -> None:
    # The actor that started us may die without a word (its node lost, the job torn
    # down); a training process it leaves behind would hold devices and ports forever.
    parent = int(os.environ.get(ENV_PARENT_PID, "0"))
    if not parent:
        return

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(EXIT_CRASHED)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


def worker_main(train_argv) -> int:
    """One host's process: join the JAX job, then train as `python -m rlinf_jax.train`.

    The job comes from the launcher's ``RLINF_*`` variables or, without them, from JAX's
    own cluster detection (a TPU pod slice, SLURM, Open MPI).
    """
    _exit_when_orphaned()
    try:
        from rlinf_jax.runtime.distributed import initialize, initialize_from_env

        if not initialize_from_env():
            initialize()
        from rlinf_jax.cli.train import main as train_main

        code = train_main(train_argv)
    except Exception:
        traceback.print_exc()
        code = EXIT_CRASHED
    sys.stdout.flush()
    sys.stderr.flush()
    if code != EXIT_OK:
        # JAX's shutdown would wait (minutes) at a barrier for processes that are
        # still computing; the launcher stops them anyway.
        os._exit(code)
    return code


# ---------------------------------------------------------------------- the Ray actor
class HostProcess:
    """Lives in one bundle of the placement group: runs that host's training process."""

    def __init__(self):
        self._proc: subprocess.Popen | None = None
        self._out: deque = deque()
        self._tail: deque = deque(maxlen=200)
        self._readers: list[threading.Thread] = []
        # Liveness: the last output line, and a file the process touches at every chunk
        # boundary (`runtime.distributed.heartbeat`).
        self._last_activity = time.time()
        fd, self._heartbeat = tempfile.mkstemp(prefix="rlinf_heartbeat_")
        os.close(fd)
        self._log = None

    def address(self) -> str:
        """``ip:port`` with a port free on this host, for the JAX coordinator."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"{ray.util.get_node_ip_address()}:{port}"

    def start(self, argv: list[str], env: dict[str, str], cwd: str | None, log_path: str | None) -> int:
        from rlinf_jax.runtime.distributed import ENV_HEARTBEAT

        full_env = {**os.environ, **env, ENV_PARENT_PID: str(os.getpid()), ENV_HEARTBEAT: self._heartbeat}
        self._last_activity = time.time()
        log = None
        if log_path:
            os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
            log = self._log = open(log_path, "a", buffering=1)
        self._proc = subprocess.Popen(
            argv,
            env=full_env,
            cwd=cwd if cwd and os.path.isdir(cwd) else None,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
            start_new_session=True,  # its own process group: stop() takes all of it
        )
        for name, stream in (("stdout", self._proc.stdout), ("stderr", self._proc.stderr)):
            t = threading.Thread(target=self._pump, args=(name, stream, log), daemon=True)
            t.start()
            self._readers.append(t)
        return self._proc.pid

    def _pump(self, name, stream, log) -> None:
        for line in iter(stream.readline, ""):
            self._last_activity = time.time()
            line = line.rstrip("\n")
            self._out.append((name, line))
            self._tail.append(line)
            if log is not None:
                log.write(line + "\n")

    def poll(self) -> int | None:
        """The exit code once the process and its output are done; None while it runs."""
        if self._proc is None or self._proc.poll() is None:
            return None
        for t in self._readers:
            t.join(timeout=5)
        self._release()
        return self._proc.returncode

    def _release(self) -> None:
        """The log file and the heartbeat file, once the process is gone."""
        if self._log is not None and not any(t.is_alive() for t in self._readers):
            self._log.close()
            self._log = None
        try:
            os.unlink(self._heartbeat)
        except OSError:
            pass

    def idle_seconds(self) -> float:
        """Seconds since the process last printed a line or finished a chunk of iterations."""
        try:
            beat = os.path.getmtime(self._heartbeat)
        except OSError:
            beat = 0.0
        return time.time() - max(self._last_activity, beat)

    def take_output(self) -> list[tuple[str, str]]:
        out = []
        while self._out:
            out.append(self._out.popleft())
        return out

    def tail(self) -> list[str]:
        return list(self._tail)

    def stop(self) -> int | None:
        """Kills the process group now. SIGTERM would not do: JAX catches it (it takes it
        for a preemption notice) and keeps running."""
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        for t in self._readers:
            t.join(timeout=5)
        self._release()
        return self._proc.returncode


# ------------------------------------------------------------------- the launcher side
@dataclass
class Outcome:
    code: int  # 0: every process finished; else the first failure's code
    cause: str = ""
    retryable: bool = False


def _describe_exit(process: int, code: int) -> str:
    if code < 0:
        try:
            return f"process {process} was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"process {process} was killed by signal {-code}"
    if code == EXIT_CRASHED:
        return f"process {process} crashed"
    return f"process {process} exited with code {code}"


def _worker_env(args, num_hosts: int, process_id: int, coordinator: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_PREFIXES)}
    for item in args.env:
        key, sep, value = item.partition("=")
        env[key] = value
    if args.devices_per_host is not None:
        flags = _DEVICE_COUNT_FLAG.sub("", env.get("XLA_FLAGS", "")).strip()
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={args.devices_per_host}".strip()
        env["JAX_PLATFORMS"] = "cpu"
    from rlinf_jax.runtime import distributed

    env.update(
        {
            distributed.ENV_COORDINATOR: coordinator,
            distributed.ENV_NUM_PROCESSES: str(num_hosts),
            distributed.ENV_PROCESS_ID: str(process_id),
            "PYTHONUNBUFFERED": "1",  # output reaches the launcher line by line
        }
    )
    return env


def _resume_overrides(overrides: list[str], cfg) -> list[str]:
    """The restarted job's overrides: continue from this run's latest checkpoint.

    A run started from another run's checkpoint (``runner.resume=<path>``) that died
    before saving its own keeps resuming from that path.
    """
    from rlinf_jax.runtime.checkpoint import list_steps
    from rlinf_jax.runtime.run_dir import RunDir

    if cfg.runner.resume not in ("none", "auto") and not list_steps(RunDir.from_config(cfg).checkpoints):
        return overrides
    return [o for o in overrides if not o.strip().startswith("runner.resume=")] + ["runner.resume=auto"]


def _check_cluster_settings(args, cfg) -> None:
    """What can be checked before any process starts (the rest the processes check)."""
    if args.num_hosts < 1:
        raise BadInput(f"--num-hosts={args.num_hosts} must be >= 1")
    if args.cpus_per_host < 0 or args.gpus_per_host < 0:
        raise BadInput("--cpus-per-host and --gpus-per-host must be >= 0")
    if args.devices_per_host is not None and args.devices_per_host < 1:
        raise BadInput(f"--devices-per-host={args.devices_per_host} must be >= 1")
    if args.placement_timeout <= 0:
        raise BadInput(f"--placement-timeout={args.placement_timeout} must be > 0 seconds")
    for item in args.env:
        if "=" not in item or not item.partition("=")[0]:
            raise BadInput(f"--env {item!r} must look like KEY=VALUE")
    if cfg.cluster.component_placement == "auto" and args.num_hosts > 1:
        raise BadInput(
            "cluster.component_placement=auto is not available in multi-host runs yet; "
            "name a preset (collocated, disaggregated, hybrid) or a mapping"
        )
    if args.devices_per_host is not None:
        # Simulated hosts: the global device count is known here, so a placement that
        # does not fit fails before Ray starts anything.
        from rlinf_jax.sharding import resolve_num_devices, resolve_placement

        from rlinf_jax.tasks.registry import task_of

        num_devices = resolve_num_devices(cfg.cluster.num_devices, args.num_hosts * args.devices_per_host)
        components = task_of(cfg).components(cfg)
        resolve_placement(cfg.cluster.component_placement, components, num_devices, cfg.cluster.mesh)


def _bundle(args) -> dict[str, float]:
    try:
        extra = json.loads(args.resources_per_host)
    except json.JSONDecodeError:
        raise BadInput(f"--resources-per-host={args.resources_per_host!r} is not JSON; e.g. '{{\"TPU\": 4}}'") from None
    if not isinstance(extra, dict) or not all(isinstance(v, (int, float)) and v >= 0 for v in extra.values()):
        raise BadInput(f"--resources-per-host={args.resources_per_host!r} must map resource names to amounts >= 0")
    bundle = {"CPU": float(args.cpus_per_host), **{str(k): float(v) for k, v in extra.items()}}
    if args.gpus_per_host:
        bundle["GPU"] = float(args.gpus_per_host)
    return {k: v for k, v in bundle.items() if v > 0} or {"CPU": 0.001}


def _fits(bundle: dict[str, float], node: dict[str, float]) -> int:
    """How many copies of ``bundle`` a node with ``node`` resources holds."""
    return int(min(node.get(k, 0.0) // v for k, v in bundle.items()))


def _show(resources: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in sorted(resources.items()) if not k.startswith(("node:", "memory", "object_store")))


class Launcher:
    # Seconds between liveness checks of the running processes (cluster.hang_timeout_s).
    liveness_every_s = 5.0

    def __init__(self, args, cfg, console_out=sys.stdout, console_err=sys.stderr):
        self.args, self.cfg = args, cfg
        self.num_hosts = args.num_hosts
        self.bundle = _bundle(args)
        self.out, self.err = console_out, console_err
        self.ray = None
        self.standalone = False

    def say(self, text: str) -> None:
        print(f"launch: {text}", file=self.err, flush=True)

    # ------------------------------------------------------------------ Ray
    def connect(self) -> None:
        address = self.args.address or os.environ.get("RAY_ADDRESS")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if not address:
            # A local instance is for this machine only: with this set before Ray is
            # imported, Ray takes 127.0.0.1 as the node address and every server it
            # starts (GCS, raylet, workers) binds to it, not to all interfaces.
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        import logging
        import warnings

        # JAX (imported here for the config checks, never run) warns on every fork; Ray
        # forks its servers, and no JAX backend lives in this process to be harmed.
        warnings.filterwarnings("ignore", message="os.fork", category=RuntimeWarning)
        import ray

        self.ray = ray
        kwargs = dict(logging_level=logging.ERROR, log_to_driver=False, configure_logging=True)
        if address:
            ray.init(address=address, **kwargs)
        else:
            ray.init(include_dashboard=False, **kwargs)
            self.standalone = True

    def strategy(self) -> str:
        if self.args.strategy != "auto":
            return self.args.strategy
        nodes = [n for n in self.ray.nodes() if n.get("Alive")]
        return "STRICT_SPREAD" if len(nodes) > 1 else "PACK"

    def check_capacity(self, strategy: str) -> None:
        """A local instance never grows: fail at once when the hosts cannot fit it."""
        if not self.standalone:
            return  # a cluster may grow (autoscaler); the placement timeout decides
        nodes = [n["Resources"] for n in self.ray.nodes() if n.get("Alive")]
        fits = [_fits(self.bundle, r) for r in nodes]
        room = sum(1 for f in fits if f) if strategy == "STRICT_SPREAD" else sum(fits)
        if room < self.num_hosts:
            raise BadInput(
                f"--num-hosts={self.num_hosts} needs {self.num_hosts} Ray bundles of {{{_show(self.bundle)}}} "
                f"({strategy}) but the local Ray instance has room for {room} ({_show(self.ray.cluster_resources())}); "
                "lower --num-hosts or --cpus-per-host, or join a bigger cluster with --address"
            )

    def place(self, strategy: str):
        from ray.util.placement_group import placement_group, remove_placement_group

        pg = placement_group([dict(self.bundle) for _ in range(self.num_hosts)], strategy=strategy)
        ready, _ = self.ray.wait([pg.ready()], timeout=self.args.placement_timeout)
        if not ready:
            remove_placement_group(pg)
            raise BadInput(
                f"Ray could not place {self.num_hosts} hosts ({{{_show(self.bundle)}}} each, {strategy}) within "
                f"{self.args.placement_timeout:g} s; the cluster has {_show(self.ray.cluster_resources())}; lower "
                "--num-hosts or the per-host resources, free the cluster, or raise --placement-timeout"
            )
        return pg

    # ------------------------------------------------------------------ one attempt
    def attempt(self, overrides: list[str], strategy: str) -> Outcome:
        from ray.util.placement_group import remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        ray = self.ray
        pg = self.place(strategy)
        resources = {k: v for k, v in self.bundle.items() if k not in ("CPU", "GPU")}
        actor_cls = ray.remote(HostProcess)
        actors = [
            actor_cls.options(
                num_cpus=self.bundle.get("CPU", 0),
                num_gpus=self.bundle.get("GPU", 0),
                resources=resources,
                max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i),
            ).remote()
            for i in range(self.num_hosts)
        ]
        try:
            coordinator = ray.get(actors[0].address.remote())
            train_argv = ["--config-name", self.args.config_name, *overrides]
            argv = [sys.executable, "-m", "rlinf_jax.launch", "--worker", *train_argv]
            log_dir = self.args.log_dir
            starts = [
                a.start.remote(
                    argv,
                    _worker_env(self.args, self.num_hosts, i, coordinator),
                    os.getcwd(),
                    os.path.join(os.path.abspath(log_dir), f"process_{i}.log") if log_dir else None,
                )
                for i, a in enumerate(actors)
            ]
            ray.get(starts)
            return self.watch(actors)
        finally:
            for a in actors:
                try:
                    ray.get(a.stop.remote(), timeout=60)
                except Exception:
                    pass  # its node is gone, and the process with it
                ray.kill(a)
            remove_placement_group(pg)

    def watch(self, actors) -> Outcome:
        ray = self.ray
        codes: list[int | None] = [None] * len(actors)
        self.primary_error_shown = False
        hang_timeout = float(self.cfg.cluster.hang_timeout_s)
        next_liveness = time.monotonic() + self.liveness_every_s
        while True:
            try:
                polled = ray.get([a.poll.remote() for a in actors], timeout=120)
                self.forward(actors[0])
            except ray.exceptions.RayError as e:
                lost = next((i for i, a in enumerate(actors) if not _alive(ray, a)), None)
                who = f"the host of process {lost}" if lost is not None else "a host"
                return Outcome(EXIT_CRASHED, f"{who} was lost ({type(e).__name__})", retryable=True)
            for i, code in enumerate(polled):
                if code is not None and codes[i] is None:
                    codes[i] = code
            if any(c not in (None, EXIT_OK) for c in codes):
                return self.failed(actors, *self.root_cause(actors, codes))
            if all(c == EXIT_OK for c in codes):
                return Outcome(EXIT_OK)
            if hang_timeout > 0 and time.monotonic() >= next_liveness:
                next_liveness = time.monotonic() + self.liveness_every_s
                hung = self.hung(actors, codes, hang_timeout)
                if hung is not None:
                    return hung
            time.sleep(0.2)

    def hung(self, actors, codes: list[int | None], timeout: float) -> Outcome | None:
        """A running process that made no progress for ``timeout`` seconds, as a failure to
        restart from the last checkpoint (None: every process is alive and working)."""
        try:
            idle = self.ray.get([a.idle_seconds.remote() for a in actors], timeout=60)
        except self.ray.exceptions.RayError:
            return None  # a lost host shows up in the next poll
        stuck = [(i, t) for i, t in enumerate(idle) if codes[i] is None and t > timeout]
        if not stuck:
            return None
        process, seconds = stuck[0]
        return Outcome(
            EXIT_CRASHED,
            f"process {process} made no progress for {seconds:.0f} s (cluster.hang_timeout_s={timeout:g})",
            retryable=True,
        )

    def root_cause(self, actors, codes: list[int | None], grace_s: float = 5.0) -> tuple[int, int]:
        """The failure to report: when one process dies the others fail soon after on
        their broken collectives (JAX aborts a process whose peer vanished), so the first
        exit seen may be a consequence. Wait a moment for the rest, then pick by rank: a
        deliberate exit (bad input, divergence, interrupt), then a process killed from
        outside (SIGKILL, SIGTERM, SIGINT, SIGHUP; an abort is what a survivor does), then
        the first failure seen."""
        deadline = time.monotonic() + grace_s
        first = next(i for i, c in enumerate(codes) if c not in (None, EXIT_OK))
        while time.monotonic() < deadline and any(c is None for c in codes):
            try:
                polled = self.ray.get([a.poll.remote() for a in actors], timeout=30)
            except self.ray.exceptions.RayError:
                break
            for i, code in enumerate(polled):
                if code is not None and codes[i] is None:
                    codes[i] = code
            time.sleep(0.2)
        external = tuple(-int(sig) for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP))
        deliberate = [i for i, c in enumerate(codes) if c in FINAL_EXITS]
        killed = [i for i, c in enumerate(codes) if c in external]
        process = (deliberate or killed or [first])[0]
        return process, codes[process]

    def forward(self, primary) -> None:
        """Process 0's output, as it comes (the others' stays in their tails)."""
        for stream, line in self.ray.get(primary.take_output.remote(), timeout=60):
            if _chatter(line):
                continue
            if stream == "stderr" and line.startswith("error:"):
                self.primary_error_shown = True
            print(line, file=self.err if stream == "stderr" else self.out, flush=True)

    def failed(self, actors, process: int, code: int) -> Outcome:
        ray = self.ray
        try:
            self.forward(actors[0])
        except Exception:
            pass
        if process != 0:
            tail = ray.get(actors[process].tail.remote(), timeout=60)
            if code == EXIT_BAD_INPUT:
                # Every process checks the same input; show its one line unless
                # process 0 already did.
                if not self.primary_error_shown:
                    lines = [ln for ln in tail if ln.startswith("error:")]
                    print(lines[-1] if lines else f"error: process {process} rejected its input", file=self.err)
            else:
                shown = [ln for ln in tail if not _chatter(ln)][-20:]
                for line in shown:
                    print(f"[process {process}] {line}", file=self.err)
        cause = _describe_exit(process, code)
        return Outcome(code, cause, retryable=code not in FINAL_EXITS)

    # ------------------------------------------------------------------ the job
    def run(self, overrides: list[str]) -> int:
        max_restarts = self.cfg.cluster.max_restarts
        strategy = self.strategy()
        self.check_capacity(strategy)
        where = "a local Ray instance" if self.standalone else "the Ray cluster"
        devices = "" if self.args.devices_per_host is None else f" x {self.args.devices_per_host} CPU devices"
        self.say(f"{self.num_hosts} process(es){devices} on {where}, placement group {strategy}")
        restarts = 0
        while True:
            t0 = time.perf_counter()
            try:
                outcome = self.attempt(overrides, strategy)
            except BadInput:
                if restarts == 0:
                    raise
                # Resources gone for good after a failure: nothing left to retry with.
                outcome = Outcome(EXIT_CRASHED, "the hosts could not be placed again", retryable=False)
            if outcome.code == EXIT_OK:
                self.say(f"finished in {time.perf_counter() - t0:.0f} s" + (f" after {restarts} restart(s)" if restarts else ""))
                return EXIT_OK
            if not outcome.retryable:
                if outcome.code in FINAL_EXITS:
                    return outcome.code
                print(f"error: {outcome.cause}", file=self.err)
                return 1
            if restarts >= max_restarts:
                print(
                    f"error: {outcome.cause}; gave up after {restarts} restart(s) (cluster.max_restarts={max_restarts})",
                    file=self.err,
                )
                return 1
            restarts += 1
            overrides = _resume_overrides(overrides, self.cfg)
            self.say(f"restart {restarts}/{max_restarts}: {outcome.cause}; resuming from the latest checkpoint")


def _alive(ray, actor) -> bool:
    try:
        ray.get(actor.poll.remote(), timeout=10)
        return True
    except Exception:
        return False


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--worker" in argv:
        # A training process started by the launcher: everything else is train's.
        return worker_main([a for a in argv if a != "--worker"])
    args = _parse_args(argv)
    launcher = None
    try:
        from rlinf_jax.tasks.registry import load_run_config

        # Warnings are left to the workers' own train processes, which print them once each.
        cfg = load_run_config(args.config_name, args.overrides)
        _check_cluster_settings(args, cfg)
        launcher = Launcher(args, cfg)
        launcher.connect()
        return launcher.run(list(args.overrides))
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted: the processes were stopped; continue with runner.resume=auto", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        if launcher is not None and launcher.ray is not None and launcher.ray.is_initialized():
            launcher.ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
