"""Device meshes and batch layouts.

A component spreads its batch (envs, samples) over the mesh's batch axes (``data`` and
``fsdp``); ``tensor`` splits layers, never the batch. The same jitted program runs on 1
or N devices: only the shardings of its inputs change.

In a multi-host run (one process per host) a mesh may hold devices this process cannot
touch. `fetch` and `put` are `jax.device_get` / `jax.device_put` that still work there:
collective where data crosses hosts, and with one process exactly the JAX functions.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P, SingleDeviceSharding

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
    return put(tree, batch_shardings(tree, mesh, batch_size))


def batch_shardings(tree, mesh: Mesh, batch_size: int | None = None):
    """The sharding `shard_batch` gives each leaf of ``tree`` (arrays, or abstract ones: how
    the planner lays out a state it never allocates)."""
    bs, rep = batch_sharding(mesh), replicated(mesh)

    def one(x):
        # Empty leaves (MJX states are full of [B, 0] arrays) stay replicated: jit returns
        # them replicated whatever went in, and the next call must see the same layout.
        split = np.ndim(x) > 0 and np.size(x) > 0 and (batch_size is None or np.shape(x)[0] == batch_size)
        return bs if split else rep

    return jax.tree.map(one, tree)


def replicate(tree, mesh: Mesh):
    return put(tree, replicated(mesh))


# ------------------------------------------------------------ across hosts
def _processes(sharding) -> frozenset[int]:
    return frozenset(d.process_index for d in sharding.device_set)


def spans_all_processes(x) -> bool:
    """Whether every process holds part of ``x`` (a jax.Array); always true on one."""
    return jax.process_count() == 1 or len(_processes(x.sharding)) == jax.process_count()


def _held_whole_everywhere(x: jax.Array) -> bool:
    # A replicated array that every process holds a copy of reads locally; anything else
    # (split, or only on some hosts) must be gathered.
    return x.sharding.is_fully_replicated and len(_processes(x.sharding)) == jax.process_count()


def _local_parts(x: jax.Array):
    """This process's shards written into a full-size buffer, and which entries they set."""
    buf = np.zeros(x.shape, x.dtype)
    mask = np.zeros(x.shape, np.bool_)
    for shard in x.addressable_shards:
        buf[shard.index] = np.asarray(shard.data)
        mask[shard.index] = True
    return buf, mask


def fetch(tree):
    """Every array leaf's full value as a NumPy array, on every process.

    One process: `jax.device_get`. Several: what a process does not hold whole is
    gathered from the others in one collective, so every process must call `fetch` on
    a tree of the same structure and shardings at the same point of the program.
    """
    if jax.process_count() == 1:
        return jax.device_get(tree)
    leaves, treedef = jax.tree.flatten(tree)
    out, gather = list(leaves), []
    for i, x in enumerate(leaves):
        if not isinstance(x, jax.Array):
            continue
        if x.size == 0:
            out[i] = np.zeros(x.shape, x.dtype)
        elif _held_whole_everywhere(x):
            out[i] = np.asarray(x)
        else:
            gather.append(i)
    if gather:
        parts = multihost_utils.process_allgather([_local_parts(leaves[i]) for i in gather])
        for i, (bufs, masks) in zip(gather, parts):
            x = leaves[i]
            value = np.zeros(x.shape, x.dtype)
            for buf, mask in zip(bufs, masks.astype(bool)):  # (processes, *shape) each
                np.copyto(value, buf.astype(x.dtype), where=mask)
            out[i] = value
    return jax.tree.unflatten(treedef, out)


def _put_host_value(x, s):
    """Host data (the same on every process) onto ``s``: each process fills its own shards.

    `jax.device_put` would first gather the value from all processes to check that it
    is the same everywhere, one collective per leaf; we know it is.
    """
    if s.is_fully_addressable or jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.extended):
        return jax.device_put(x, s)
    value = np.asarray(x)
    value = value.astype(jax.dtypes.canonicalize_dtype(value.dtype), copy=False)
    return jax.make_array_from_callback(value.shape, s, lambda index: value[index], dtype=value.dtype)


def put(tree, shardings):
    """`jax.device_put` onto ``shardings`` (a matching tree, or one sharding for all),
    also from a mesh on some hosts to a mesh on others. One process: `jax.device_put`.

    Several processes, per leaf: one already laid out as asked is returned as it is;
    host data (NumPy, scalars, arrays of this process alone) is the same on every
    process and each fills its own shards; an array that moves between devices of one
    process is copied there, the other processes get its empty stand-in; one that
    stays on the same devices is resharded on them; anything else goes through the
    hosts (`fetch`).
    """
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)
    if isinstance(shardings, jax.sharding.Sharding):
        shardings = jax.tree.map(lambda _: shardings, tree)

    leaves, treedef = jax.tree.flatten(tree)
    targets = treedef.flatten_up_to(shardings)
    out, via_host = list(leaves), []
    for i, (x, s) in enumerate(zip(leaves, targets)):
        if not isinstance(x, jax.Array):
            out[i] = _put_host_value(x, s)
        elif x.sharding == s:
            continue
        elif x.sharding.device_set == s.device_set:
            out[i] = jax.device_put(x, s)
        elif isinstance(x.sharding, SingleDeviceSharding) and x.is_fully_addressable:
            # Computed by each process on its own default device (an env reset before
            # placement): the same everywhere, so each process's copy is the host value.
            # Arrays of a component's mesh have named shardings and never land here.
            out[i] = _put_host_value(x, s)
        elif len(_processes(x.sharding) | _processes(s)) == 1:
            if x.is_fully_addressable:
                out[i] = jax.device_put(x, s)
            else:
                out[i] = jax.make_array_from_single_device_arrays(x.shape, s, [], dtype=x.dtype)
        else:
            via_host.append(i)
    if via_host:
        values = fetch([leaves[i] for i in via_host])
        for i, v in zip(via_host, values):
            out[i] = _put_host_value(v, targets[i])
    return jax.tree.unflatten(treedef, out)


def place_rows(tree, mesh: Mesh, rows: int):
    """Leaves with ``rows`` leading rows split over the mesh's batch axes when they divide,
    the rest replicated (through `put`, so it works across hosts)."""
    split = rows % batch_divisor(mesh) == 0
    bs, rep = batch_sharding(mesh), replicated(mesh)
    return jax.tree.map(lambda x: put(x, bs if split and np.ndim(x) and np.shape(x)[0] == rows else rep), tree)


def rows_by_process(mesh: Mesh, rows: int) -> dict[int, tuple[int, int]]:
    """``{process: [lo, hi)}``: which rows of a ``rows``-long batch split over ``mesh``'s
    batch axes each process's devices hold (processes without a device of the mesh are
    absent). Computed from the whole mesh, so every process reaches the same answer, and
    the same refusal: a process's rows must be one block, and no row may live on two
    processes (work done row by row on the host would run twice)."""
    held: dict[int, list[tuple[int, int]]] = {}
    owners: dict[tuple[int, int], set[int]] = {}
    for device, idx in batch_sharding(mesh).devices_indices_map((rows,)).items():
        block = (idx[0].start or 0, rows if idx[0].stop is None else idx[0].stop)
        held.setdefault(device.process_index, []).append(block)
        owners.setdefault(block, set()).add(device.process_index)
    shared = {b: p for b, p in owners.items() if len(p) > 1}
    if shared:
        (lo, hi), procs = min(shared.items())
        raise BadInput(
            f"rows {lo}-{hi - 1} of the batch of {rows} live on processes {sorted(procs)}: work done on the host "
            "row by row needs each row on one host; split the batch over every host (drop the mesh's non-batch "
            "axes across hosts)"
        )
    out = {}
    for process, blocks in held.items():
        lo, hi = min(a for a, _ in blocks), max(b for _, b in blocks)
        if sum(b - a for a, b in set(blocks)) != hi - lo:
            raise BadInput(f"process {process}'s rows of the batch of {rows} are not one block on this mesh")
        out[process] = (lo, hi)
    return out


def process_rows(mesh: Mesh, rows: int) -> tuple[int, int]:
    """``[lo, hi)``: this process's rows of `rows_by_process` (``(0, 0)`` for a process
    without a device of the mesh). Work done row by row on the host (a host simulator's
    envs) runs where its rows live; with one process, every row."""
    if jax.process_count() == 1:
        return 0, rows
    return rows_by_process(mesh, rows).get(jax.process_index(), (0, 0))


def from_process_rows(tree, mesh: Mesh, rows: int, batch_dim: int = 0):
    """Global arrays of a ``rows``-long batch whose rows (``batch_dim``) each process holds
    on the host (`process_rows`): the inverse of reading one's own rows. One process:
    `jax.device_put`."""
    s = batch_sharding(mesh, batch_dim)
    holds_none = not s.addressable_devices

    def place(x):
        x = np.asarray(x)
        shape = (*x.shape[:batch_dim], rows, *x.shape[batch_dim + 1:])
        if holds_none:  # a process outside the mesh: the array's stand-in, with no shard here
            return jax.make_array_from_single_device_arrays(shape, s, [], dtype=jax.dtypes.canonicalize_dtype(x.dtype))
        return jax.make_array_from_process_local_data(s, x, shape)

    return jax.tree.map(place, tree)
