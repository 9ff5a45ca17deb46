"""The two layouts of a causal LM's decoder blocks, and the conversion between them.

Unrolled, block ``i``'s parameters sit at ``layers.<i>.<name>`` (``layers.3.mlp.up_proj.kernel``
``[in, out]``), and the forward pass is one copy of the block per layer in the compiled program.
Scanned, every block's parameter of one name is a single array with a leading layer axis,
``layers.<name>`` (``[num_layers, in, out]``), and the forward pass runs one block under
``lax.scan``: XLA compiles it once, whatever the depth. The leading axis carries the logical
name ``layers``, which the partition rules never shard (each scan step reads one layer).

Both layouts hold the same numbers. Hugging Face checkpoints, converted directories and the key
map speak the unrolled one; a scanned model is stacked on loading and unstacked on export. The
helpers here work on flat ``{dotted path: array}`` dicts of numpy or JAX arrays.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlinf_jax.errors import BadInput

# The module that holds the blocks, and the logical name of the stacked axis.
LAYERS = "layers"
LAYER_AXIS = "layers"


def layer_of(path: str) -> tuple[str, int] | None:
    """``("layers.<name>", i)`` for an unrolled block parameter ``layers.<i>.<name>``, else None."""
    parts = path.split(".")
    if len(parts) > 2 and parts[0] == LAYERS and parts[1].isdigit():
        return ".".join([LAYERS, *parts[2:]]), int(parts[1])
    return None


def is_stacked(paths) -> bool:
    """Whether flat parameter paths are in the scanned layout (``layers.<name>``)."""
    return any(p.startswith(LAYERS + ".") and layer_of(p) is None for p in paths)


def stack_flat(flat: Mapping[str, object], num_layers: int, stack=None) -> dict[str, object]:
    """Unrolled flat parameters -> scanned: each ``layers.<i>.<name>`` joins ``layers.<name>``
    at row ``i``. ``stack(name, arrays)`` joins one name's ``num_layers`` arrays (default:
    numpy's or jax.numpy's ``stack``, as the arrays are; a loader passes one that places the
    result on its sharding)."""
    groups: dict[str, list] = {}
    for path in flat:
        found = layer_of(path)
        if found is not None:
            name, i = found
            if i >= num_layers:
                raise BadInput(f"parameter {path} is of layer {i}, but the model has {num_layers} layers")
            groups.setdefault(name, [None] * num_layers)[i] = path
    out = {k: v for k, v in flat.items() if layer_of(k) is None}
    for name, paths in groups.items():
        if None in paths:
            missing = name.replace(f"{LAYERS}.", f"{LAYERS}.{paths.index(None)}.", 1)
            raise BadInput(f"parameter {missing} is missing, so {name} cannot be stacked for a scan")
        arrays = [flat[p] for p in paths]
        if stack is not None:
            out[name] = stack(name, arrays)
        else:
            out[name] = (np.stack if isinstance(arrays[0], np.ndarray) else jnp.stack)(arrays)
    return out


def unstack_flat(flat: Mapping[str, object]) -> dict[str, object]:
    """Scanned flat parameters -> unrolled: ``layers.<name> [L, ...]`` -> ``layers.<i>.<name>``."""
    out = {}
    for path, value in flat.items():
        if path.startswith(LAYERS + ".") and layer_of(path) is None:
            rest = path[len(LAYERS) + 1 :]
            for i in range(value.shape[0]):
                out[f"{LAYERS}.{i}.{rest}"] = value[i]
        else:
            out[path] = value
    return out


def stack_variables(states: list[nnx.State]) -> nnx.State:
    """One block's state from the states of ``len(states)`` blocks of one structure: every
    variable's value stacked on a new leading axis, named ``layers`` in its partition names."""
    flats = [dict(nnx.to_flat_state(s)) for s in states]
    out = []
    for path, var in flats[0].items():
        value = jnp.stack([flat[path].get_value() for flat in flats])
        names = var.get_metadata().get("out_sharding")
        meta = {"out_sharding": (LAYER_AXIS, *names)} if names else {}
        out.append((path, var.replace(value, **meta)))
    return nnx.from_flat_state(out)
