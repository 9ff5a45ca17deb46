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
from rlinf_jax.sharding.placement import (
    ComponentPlacement,
    Placement,
    component_mesh,
    derive_mode,
    parse_ranks,
    preset,
    resolve_placement,
)
from rlinf_jax.sharding.partition import (
    DEFAULT_RULES,
    PARAM_AXES,
    default_spec,
    init_sharded,
    logical_axes,
    logical_to_spec,
    param_shardings,
    rules_from_config,
    shard_params,
)
from rlinf_jax.sharding.reshard import reshard, sync_weights

__all__ = [
    "DATA_AXIS",
    "DEFAULT_RULES",
    "PARAM_AXES",
    "default_spec",
    "init_sharded",
    "logical_axes",
    "logical_to_spec",
    "param_shardings",
    "rules_from_config",
    "shard_params",
    "ComponentPlacement",
    "Placement",
    "batch_sharding",
    "component_mesh",
    "data_mesh",
    "derive_mode",
    "parse_ranks",
    "preset",
    "replicate",
    "replicated",
    "reshard",
    "resolve_num_devices",
    "resolve_placement",
    "shard_batch",
    "sync_weights",
]
