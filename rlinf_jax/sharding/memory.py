"""Parking idle state in host memory through JAX memory kinds.

Collocated components take turns on the same devices: while the rollout generates, the
actor's optimiser state (two moments per parameter under Adam) only occupies memory the
rollout could use. `park` moves such a tree to the devices' host memory
(``pinned_host``, with the same sharding) and `unpark` brings it back before it is
needed; both are asynchronous copies, so they overlap the stage that runs in between.
"""

from __future__ import annotations

import jax

HOST = "pinned_host"
DEVICE = "device"


def _move(tree, kind: str):
    def move(x):
        if not isinstance(x, jax.Array) or x.sharding.memory_kind == kind:
            return x
        return jax.device_put(x, x.sharding.with_memory_kind(kind))

    return jax.tree.map(move, tree)


def host_memory_supported(device=None) -> bool:
    device = jax.devices()[0] if device is None else device
    return HOST in {m.kind for m in device.addressable_memories()}


def park(tree):
    """Moves every array of ``tree`` to host memory, keeping its sharding."""
    return _move(tree, HOST)


def unpark(tree):
    """Moves every array of ``tree`` back to device memory."""
    return _move(tree, DEVICE)
