"""Device meshes for data-parallel training.

A run spreads its env batch over the ``data`` axis; parameters are replicated. The same
jitted program runs on 1 or N devices: only the shardings of its inputs change.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from rlinf_jax.errors import BadInput

DATA_AXIS = "data"


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


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading axis split over ``data``; every other axis whole."""
    return NamedSharding(mesh, P(DATA_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def shard_batch(tree, mesh: Mesh):
    """Places every leaf with a leading batch axis on the data axis (scalars replicated)."""
    bs, rep = batch_sharding(mesh), replicated(mesh)
    return jax.tree.map(lambda x: jax.device_put(x, bs if np.ndim(x) > 0 else rep), tree)


def replicate(tree, mesh: Mesh):
    return jax.device_put(tree, replicated(mesh))
