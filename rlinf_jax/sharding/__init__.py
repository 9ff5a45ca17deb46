"""Meshes, placements and partition rules."""

from rlinf_jax.sharding.mesh import (
    DATA_AXIS,
    batch_sharding,
    data_mesh,
    replicate,
    replicated,
    resolve_num_devices,
    shard_batch,
)

__all__ = ["DATA_AXIS", "batch_sharding", "data_mesh", "replicate", "replicated", "resolve_num_devices", "shard_batch"]
