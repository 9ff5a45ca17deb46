"""One JAX process per host: joining the multi-controller job, and who does what in it.

A multi-host run is one program that every process runs (JAX's multi-controller model):
each process drives its own devices, and `jax.devices()` lists the devices of all hosts,
so a mesh over them is one global mesh. Whatever touches a jitted program or a
checkpoint therefore runs on every process in the same order; whatever only writes
files for people (metrics, TensorBoard, placement.json, config.yaml) runs on process 0.

The launcher (`rlinf_jax.launch`) hands each process its place in the job through the
``RLINF_*`` environment variables below; without them `initialize` leaves the choice to
JAX's own cluster detection (TPU pod slices, SLURM, Open MPI), and a single process
needs nothing at all.
"""

from __future__ import annotations

import contextlib
import itertools
import os

import jax
from jax._src import distributed as jax_distributed  # the coordination client; no public API

ENV_COORDINATOR = "RLINF_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "RLINF_NUM_PROCESSES"
ENV_PROCESS_ID = "RLINF_PROCESS_ID"
# Seconds every process waits for all the others to join before giving up.
ENV_INIT_TIMEOUT = "RLINF_INIT_TIMEOUT"


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    timeout_s: int = 300,
) -> None:
    """Joins the job; call before anything touches a JAX backend.

    All three of ``coordinator_address`` (``host:port`` of process 0), ``num_processes``
    and ``process_id`` given: an explicit job (what the launcher does). All None: JAX
    detects the cluster itself. CPU collectives go through gloo: without it a CPU
    computation that spans processes has no way to exchange data.
    """
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # The persistent compilation cache stays on (runner.compilation_cache), though it helps
    # process 0 alone: JAX writes entries from process 0 only, and on the CPU a program's
    # key differs per process (it hashes the process's own device topology), so the others
    # always compile. Process 0 loading its copy instead of compiling alongside them still
    # shortens the start where the processes share a machine's cores.
    kwargs = {}
    if coordinator_address is not None:
        kwargs = dict(coordinator_address=coordinator_address, num_processes=num_processes, process_id=process_id)
        if str(coordinator_address).rsplit(":", 1)[0] in ("127.0.0.1", "localhost"):
            # Everything on one machine: the coordinator needs no outside interface.
            kwargs["coordinator_bind_address"] = coordinator_address
    jax.distributed.initialize(**kwargs, initialization_timeout=int(timeout_s))


def initialize_from_env(environ=None) -> bool:
    """`initialize` from the launcher's ``RLINF_*`` variables; False when they are unset."""
    env = os.environ if environ is None else environ
    if ENV_COORDINATOR not in env:
        return False
    initialize(
        env[ENV_COORDINATOR],
        int(env[ENV_NUM_PROCESSES]),
        int(env[ENV_PROCESS_ID]),
        timeout_s=int(env.get(ENV_INIT_TIMEOUT, 300)),
    )
    return True


def is_multiprocess() -> bool:
    # Asked without starting a backend: a single process never joined a job.
    return jax.distributed.is_initialized() and jax.process_count() > 1


def is_primary() -> bool:
    """Process 0: the one that writes what people read."""
    return not is_multiprocess() or jax.process_index() == 0


_barrier_count = itertools.count()


# Set by `python -m rlinf_jax.launch` for each training process: a file whose mtime says
# when the process last made progress (the launcher restarts a job that stops making any).
ENV_HEARTBEAT = "RLINF_HEARTBEAT_FILE"


def heartbeat() -> None:
    """Marks progress for the launcher's liveness check; free when no launcher watches."""
    path = os.environ.get(ENV_HEARTBEAT)
    if path:
        try:
            os.utime(path, None)
        except FileNotFoundError:
            open(path, "a").close()
        except OSError:
            pass  # a heartbeat that cannot be written only weakens the watch


def barrier(name: str, timeout_s: float = 1800.0) -> None:
    """Waits until every process got here; free with one process.

    For file system steps that one process performs for all (process 0 deletes, the
    others must not list the folder before it is done), and to line processes up
    before a program's first run. It goes through the coordination service rather
    than a device collective: gloo gives processes only 30 s to meet when it sets up a
    collective, so a process still compiling would sink the others.
    """
    if is_multiprocess():
        # Coordination barriers are single-use; every process numbers them alike.
        key = f"rlinf:{name}:{next(_barrier_count)}"
        jax_distributed.global_state.client.wait_at_barrier(key, int(timeout_s * 1000))


_shared_count = itertools.count()


def from_primary(name: str, value: str, timeout_s: float = 1800.0) -> str:
    """Process 0's ``value`` on every process (free with one process): for a decision only
    process 0 can make, such as whether it got the run folder's lock. Through the
    coordination service's key-value store, like `barrier`."""
    if not is_multiprocess():
        return value
    key = f"rlinf:{name}:{next(_shared_count)}"
    client = jax_distributed.global_state.client
    if jax.process_index() == 0:
        client.key_value_set(key, "=" + value)  # never empty: the store may refuse ""
        return value
    return client.blocking_key_value_get(key, int(timeout_s * 1000))[1:]


@contextlib.contextmanager
def local_devices_first():
    """Within it, a bare `jax.devices()` lists this process's own devices.

    Simulators place their model arrays on ``jax.devices()[0]`` (MJX's put_model, which
    Brax calls, does). In a multi-host job that is process 0's device: every other
    process would hold arrays it cannot read, and its jitted env steps could not use
    them. Envs are built inside this context so each process keeps its model at home.
    Meshes are not: they need the global list.
    """
    if not is_multiprocess():
        yield
        return
    global_devices = jax.devices
    jax.devices = lambda backend=None: jax.local_devices(backend=backend)
    try:
        yield
    finally:
        jax.devices = global_devices
