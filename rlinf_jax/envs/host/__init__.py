"""Host simulators (C MuJoCo through Gymnasium, ...) stepped by supervised worker processes
over shared memory. `worker.py` is the worker's script and is never imported here: it runs
under any interpreter with numpy and the simulator (``env.worker_python``)."""

from rlinf_jax.envs.host.pool import HostEnvPool, HostEnvSpec, describe

__all__ = ["HostEnvPool", "HostEnvSpec", "describe"]
