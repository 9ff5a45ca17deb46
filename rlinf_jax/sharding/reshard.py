"""Weight sync: move a parameter tree onto another component's shardings.

One primitive serves every placement. Collocated components with identical shardings
share arrays and copy nothing; otherwise `jax.device_put` reshards leaf by leaf, donating
the source buffers when the caller no longer needs them (the actor keeps its copy, so
actor -> rollout sync does not donate; a one-way hand-off does). With ``only``, just the
selected leaves (e.g. LoRA adapters) move and the rest of the destination tree is kept.

Donation frees each source leaf right after its copy lands, so peak memory is one leaf
more than the destination tree (a leaf whose shards the new layout keeps in place is
left to the caller to drop). `jax.device_put(..., donate=True)` itself crashed
(segfault) on CPU devices in jax 0.10.2, so it is not used.
"""

from __future__ import annotations

from collections.abc import Callable

import functools

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding

from rlinf_jax.sharding.mesh import put


def reshard(tree, shardings, *, donate: bool = False):
    """Returns ``tree`` placed on ``shardings`` (a matching tree, or one sharding for all).

    Leaves already laid out as asked are returned as they are: same buffers, no copy.
    """
    if jax.process_count() > 1:
        # Across hosts a device-to-device copy cannot leave its process: `put` routes it
        # (without donation; the source is dropped by the caller).
        return put(tree, shardings)
    if isinstance(shardings, jax.sharding.Sharding):
        shardings = jax.tree.map(lambda _: shardings, tree)

    moved = {}  # one buffer may sit at several leaves (XLA dedupes equal outputs): moved once

    def move(x, s):
        if isinstance(x, jax.Array) and x.sharding == s:
            return x
        if donate and isinstance(x, jax.Array):
            key = (id(x), s)
            if key not in moved:
                y = moved[key] = relayout(x, s).block_until_ready()
                # A shard already on a device of the new layout may be kept, not copied:
                # then the source's buffers live on in ``y`` and are not freed here.
                if not _buffers(x) & _buffers(y):
                    x.delete()
            return moved[key]
        return relayout(x, s) if isinstance(x, jax.Array) else jax.device_put(x, s)

    return jax.tree.map(move, tree, shardings)


def relayout(x: jax.Array, s: jax.sharding.Sharding) -> jax.Array:
    """``x`` on ``s``, device to device, where ``s``'s devices are a superset of ``x``'s or
    a subset of them (a component's state onto a phase's larger mesh, and back).

    `jax.device_put` copies a shard device to device only when the new layout has a piece
    with the same index (as it does here for those); a leaf whose pieces change (``fsdp:
    2`` -> ``fsdp: 4``) it gathers on the host and splits again. Here the change of pieces
    is a compiled program on the larger device set instead (XLA's collectives over the
    chips' links), and the step between the two sets keeps every piece's index: the
    smaller layout's pieces repeated over the larger set (`_repeated`). Anything else
    (sets that are neither, sizes that are not multiples, other sharding kinds) is
    `jax.device_put`.
    """
    src = x.sharding
    if (not (isinstance(src, NamedSharding) and isinstance(s, NamedSharding)) or src.device_set == s.device_set
            or _pieces(s, x.shape) <= _pieces(src, x.shape)):  # every new piece an old one: copied as it is
        return jax.device_put(x, s)
    if s.device_set > src.device_set:  # onto more devices: repeat the pieces there, then re-cut
        mid = _repeated(src, s.mesh.devices.flat)
        return jax.device_put(x, s) if mid is None else _cut(s)(jax.device_put(x, mid))
    if s.device_set < src.device_set:  # onto fewer: cut into the smaller layout's pieces, repeated, then keep its own
        mid = _repeated(s, src.mesh.devices.flat)
        return jax.device_put(x, s) if mid is None else jax.device_put(_cut(mid)(x), s)
    return jax.device_put(x, s)


def _pieces(sharding, shape) -> set:
    """The index ranges of ``sharding``'s pieces of an array of ``shape``."""
    return {tuple((i.start, i.stop, i.step) for i in index) for index in sharding.devices_indices_map(shape).values()}


def _repeated(sharding: NamedSharding, devices) -> NamedSharding | None:
    """``sharding``'s pieces repeated over ``devices`` (a leading mesh axis of copies), in
    the order ``devices`` come (a compiled program's devices must be in the same order),
    with one copy on ``sharding``'s own devices in their own order. None where no such mesh
    exists: a count that is not a multiple, or its own devices not a run of ``devices`` at
    a multiple of their count (the presets put the actor last, where they are)."""
    order, own = list(devices), list(sharding.mesh.devices.flat)
    copies, rest = divmod(len(order), len(own))
    if rest or not any(order[c * len(own):(c + 1) * len(own)] == own for c in range(copies)):
        return None
    grid = np.array(order, dtype=object).reshape((copies, *sharding.mesh.devices.shape))
    names = ("_copies", *sharding.mesh.axis_names)
    return NamedSharding(Mesh(grid, names, axis_types=(AxisType.Auto,) * len(names)), sharding.spec)


@functools.lru_cache(maxsize=None)
def _cut(s: NamedSharding):
    """The compiled change of layout onto ``s`` (from any layout on the same devices), one
    per target layout: compiled on first use, never again."""
    return jax.jit(lambda v: v, out_shardings=s)


def _buffers(x: jax.Array) -> set[int]:
    return {shard.data.unsafe_buffer_pointer() for shard in x.addressable_shards}


def sync_weights(src, dst, *, only: Callable[[tuple, jax.Array], bool] | None = None, donate: bool = False):
    """Copies ``src``'s values into the layout of ``dst`` (same tree structure).

    ``only(path, leaf) -> bool`` picks the leaves that move (trainable subset); the others
    keep ``dst``'s arrays.
    """
    dst_shardings = jax.tree.map(lambda x: x.sharding, dst)
    if only is None:
        return reshard(src, dst_shardings, donate=donate)
    return jax.tree_util.tree_map_with_path(
        lambda path, s, d, sh: reshard(s, sh, donate=donate) if only(path, s) else d, src, dst, dst_shardings
    )
