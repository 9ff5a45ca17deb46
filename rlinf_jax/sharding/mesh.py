"""Device meshes and batch layouts.

A component spreads its batch (envs, samples) over the mesh's batch axes (``data`` and
``fsdp``); ``tensor`` splits layers, never the batch. The same jitted program runs on 1
or N devices: only the shardings of its inputs change.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from rlinf_jax.errors import BadInput

DATA_AXIS = "data"
# Mesh axes a batch is split over; ``tensor`` replicates the batch.
BATCH_AXES = ("data", "fsdp")


def resolve_num_devices(spec: str | int, available: int | None = None) -> int:
    available = jax.device_count() if available is None else available
    if str(spec) == "all":
        return available
    try:
        n = int(spec)
    except ValueError:
        raise BadInput(f"cluster.num_devices={spec!r} must be 'all' or a positive integer") from None
    if not 1 <= n <= available:
        raise BadInput(f"cluster.num_devices={n} but {available} device(s) are available; use 1..{available} or 'all'")
    return n


def data_mesh(num_devices: int) -> Mesh:
    # Auto axis types: the trainer relies on sharding propagation inside jit.
    devices = np.array(jax.devices()[:num_devices])
    return Mesh(devices, (DATA_AXIS,), axis_types=(AxisType.Auto,))


def batch_axes(mesh: Mesh) -> tuple[str, ...]:
    return tuple(a for a in mesh.axis_names if a in BATCH_AXES)


def batch_divisor(mesh: Mesh) -> int:
    """How many ways a batch is split on ``mesh``: batch sizes must be multiples of it."""
    return int(np.prod([mesh.shape[a] for a in batch_axes(mesh)]))


def batch_spec(mesh: Mesh, batch_dim: int = 0) -> P:
    axes = batch_axes(mesh)
    return P(*([None] * batch_dim), axes if axes else None)


def batch_sharding(mesh: Mesh, batch_dim: int = 0) -> NamedSharding:
    """The batch dimension split over the batch axes; every other dimension whole."""
    return NamedSharding(mesh, batch_spec(mesh, batch_dim))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def shard_batch(tree, mesh: Mesh, batch_size: int | None = None):
    """Splits leaves whose leading dimension is the batch over the batch axes.

    With ``batch_size``, only leaves of that leading size are split and the rest (e.g. a
    key shared by the whole batch) replicated; without it every non-scalar leaf is split.
    """
    bs, rep = batch_sharding(mesh), replicated(mesh)

    def place(x):
        # Empty leaves (MJX states are full of [B, 0] arrays) stay replicated: jit returns
        # them replicated whatever went in, and the next call must see the same layout.
        split = np.ndim(x) > 0 and np.size(x) > 0 and (batch_size is None or np.shape(x)[0] == batch_size)
        return jax.device_put(x, bs if split else rep)

    return jax.tree.map(place, tree)


def replicate(tree, mesh: Mesh):
    return jax.device_put(tree, replicated(mesh))
