"""Partition rules: logical axis names on parameters -> shardings on a component's mesh.

Models name what each parameter dimension *means* (``("embed", "mlp")``), not where it
lives; the mesh axes are chosen per component when the parameters are placed. The same
model can then be laid out FSDP-style on the actor's mesh and tensor-parallel on the
rollout's, from one set of annotations and one table of rules.

Annotations are flax's ``out_sharding`` metadata on a `nnx.Variable`
(`nnx.with_partitioning`). Flax shards annotated variables eagerly against the global
mesh by default, which cannot work when the mesh is only known per component and the
names are logical, so models here annotate with `logical_axes` (eager sharding off) and
this module resolves the names later, leaf by leaf.

Resolution is deliberately forgiving about the mesh and strict about the names: mesh
axes a component lacks or has at size 1 are dropped, a dimension a mesh axis does not
divide stays whole (e.g. 2 KV heads on tensor=4), and a mesh axis is used at most once
per array; an unknown logical name is a `BadInput`. Leaves without annotations fall back
to `default_spec`, a size-based FSDP rule.

Specs are canonical: trailing unsharded dimensions are left out, so a replicated leaf has
``PartitionSpec()``, the same sharding `mesh.replicated` gives.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rlinf_jax.errors import BadInput
from rlinf_jax.sharding.placement import MESH_AXES

# Parameters are split over these axes only; ``data`` holds a full copy per replica.
PARAM_AXES = ("fsdp", "tensor")

DEFAULT_RULES: Mapping[str, str | tuple[str, ...] | None] = MappingProxyType(
    {
        "batch": ("data", "fsdp"),
        "vocab": "tensor",
        "embed": "fsdp",
        "mlp": "tensor",
        "q_heads": "tensor",
        "kv_heads": "tensor",
        "head_dim": None,
        "norm": None,
        # The leading axis of a scanned LM's stacked parameters: each scan step reads one
        # layer, so splitting the layers over devices would gather them back every step.
        "layers": None,
    }
)


def logical_axes(initializer, names: Sequence[str | None]):
    """``initializer`` annotated with logical axis ``names``, resolved later per mesh.

    Same as `nnx.with_partitioning` but without flax's eager sharding (which would need a
    global mesh whose axes are the logical names).
    """
    return nnx.with_partitioning(initializer, tuple(names), eager_sharding=False)


def _as_axes(target) -> tuple[str, ...]:
    if target is None:
        return ()
    if isinstance(target, str):
        return (target,)
    return tuple(target)


def _canonical(entries: list) -> PartitionSpec:
    while entries and entries[-1] is None:
        entries.pop()
    return PartitionSpec(*entries)


def _entry(axes: tuple[str, ...]):
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else axes


def logical_to_spec(logical_spec, mesh: Mesh, rules: Mapping | None = None, shape=None) -> PartitionSpec:
    """Maps logical names (one entry per dimension: a name, a tuple of names, or None) to a spec.

    ``mesh`` may be a `Mesh` or an `AbstractMesh`; only its axis names and sizes are read.

    A dimension's mesh axes are those its names map to, less axes the mesh lacks, axes of
    size 1 and axes an earlier dimension took. With ``shape``, a dimension whose size the
    product of its axes does not divide is left whole, and its axes stay free for later
    dimensions.
    """
    rules = DEFAULT_RULES if rules is None else rules
    if isinstance(logical_spec, NamedSharding):
        logical_spec = logical_spec.spec
    if logical_spec is None:
        logical_spec = ()
    if isinstance(logical_spec, str):
        logical_spec = (logical_spec,)
    logical_spec = tuple(logical_spec)
    if shape is not None and len(logical_spec) > len(shape):
        raise BadInput(
            f"logical axes {logical_spec} name {len(logical_spec)} dimensions but the array has shape {tuple(shape)}; "
            "give one name (or None) per dimension"
        )
    sizes = dict(mesh.shape)
    used: set[str] = set()
    entries = []
    for dim, names in enumerate(logical_spec):
        if names is None or names is PartitionSpec.UNCONSTRAINED:
            entries.append(None)
            continue
        axes: list[str] = []
        for name in _as_axes(names):
            if name not in rules:
                raise BadInput(
                    f"unknown logical axis {name!r}; known names are {', '.join(sorted(rules))} "
                    "(add it to the partition rules or fix the annotation)"
                )
            for axis in _as_axes(rules[name]):
                if sizes.get(axis, 1) > 1 and axis not in used and axis not in axes:
                    axes.append(axis)
        if shape is not None and axes and shape[dim] % math.prod(sizes[a] for a in axes):
            axes = []
        used.update(axes)
        entries.append(_entry(tuple(axes)))
    return _canonical(entries)


def default_spec(shape, mesh: Mesh, min_size: int = 2**14) -> PartitionSpec:
    """FSDP-style spec for a leaf without annotations.

    Arrays of at least ``min_size`` elements are split over all parameter axes of the
    mesh (``fsdp`` and ``tensor`` of size > 1) along their largest dimension those axes
    divide (the first on a tie). Smaller arrays, scalars, and arrays no dimension of which
    divides, are replicated: splitting them saves little and costs a gather each use.
    """
    shape = tuple(shape)
    axes = tuple(a for a in mesh.axis_names if a in PARAM_AXES and mesh.shape[a] > 1)
    if not axes or not shape or math.prod(shape) < min_size:
        return PartitionSpec()
    n = math.prod(mesh.shape[a] for a in axes)
    fits = [d for d, size in enumerate(shape) if size % n == 0]
    if not fits:
        return PartitionSpec()
    dim = max(fits, key=lambda d: (shape[d], -d))
    entries = [None] * len(shape)
    entries[dim] = _entry(axes)
    return _canonical(entries)


def _is_variable(x) -> bool:
    return isinstance(x, nnx.Variable)


def _annotation(var):
    """The logical names a variable was annotated with, or None."""
    spec = var.get_metadata().get("out_sharding")
    return spec if spec else None


def param_shardings(state_or_tree, mesh: Mesh, rules: Mapping | None = None, min_size: int = 2**14):
    """A `NamedSharding` for every leaf of an `nnx.State`, a module, or a plain pytree.

    The result has the input's structure (for a module: its state's), so it can be handed
    to `jax.device_put` or to ``jit(out_shardings=...)``. Leaves may be arrays or
    `jax.ShapeDtypeStruct` (an `nnx.eval_shape` state), so a large model can be laid out
    before it exists. Annotated leaves follow ``rules``; the rest follow `default_spec`.
    """
    rules = DEFAULT_RULES if rules is None else rules
    tree = nnx.state(state_or_tree) if isinstance(state_or_tree, nnx.Module) else state_or_tree

    def one(path, leaf):
        if _is_variable(leaf):
            names, shape = _annotation(leaf), np.shape(leaf.get_value())
        else:
            names, shape = None, np.shape(leaf)
        try:
            spec = default_spec(shape, mesh, min_size) if names is None else logical_to_spec(names, mesh, rules, shape)
        except BadInput as e:
            raise BadInput(f"parameter {jax.tree_util.keystr(path)}: {e}") from None
        sharding = NamedSharding(mesh, spec)
        return leaf.replace(sharding) if _is_variable(leaf) else sharding

    return jax.tree_util.tree_map_with_path(one, tree, is_leaf=_is_variable)


def shard_params(tree, mesh: Mesh, rules: Mapping | None = None, min_size: int = 2**14):
    """``tree`` placed on `param_shardings`; a module comes back as a new, sharded module."""
    if isinstance(tree, nnx.Module):
        graphdef, state = nnx.split(tree)
        return nnx.merge(graphdef, shard_params(state, mesh, rules, min_size))
    return jax.device_put(tree, param_shardings(tree, mesh, rules, min_size))


def init_sharded(make_model, mesh: Mesh, rules: Mapping | None = None, min_size: int = 2**14):
    """Builds ``make_model()`` with every parameter created directly on its shard.

    The layout comes from the abstract model, so no device ever holds the whole model.
    """
    graphdef, abstract = nnx.split(nnx.eval_shape(make_model))
    shardings = param_shardings(abstract, mesh, rules, min_size)
    state = jax.jit(lambda: nnx.split(make_model())[1], out_shardings=shardings)()
    return nnx.merge(graphdef, state)


def rules_from_config(overrides: Mapping | None) -> dict[str, str | tuple[str, ...] | None]:
    """DEFAULT_RULES with ``overrides`` (logical name -> axis, list of axes, or null) on top."""
    rules = dict(DEFAULT_RULES)
    if overrides is None:
        return rules
    if not isinstance(overrides, Mapping):
        raise BadInput(f"partition rules must be a mapping of logical name -> mesh axis, got {type(overrides).__name__}")
    for name, target in overrides.items():
        if not isinstance(name, str) or not name:
            raise BadInput(f"partition rules: logical name {name!r} must be a non-empty string")
        if target is None or isinstance(target, str):
            axes = _as_axes(target)
        elif not isinstance(target, Mapping) and (isinstance(target, Sequence) or hasattr(target, "__iter__")):
            axes = tuple(target)
        else:
            raise BadInput(f"partition rules: {name}={target!r} must be a mesh axis, a list of mesh axes, or null")
        for axis in axes:
            if axis not in MESH_AXES:
                raise BadInput(f"partition rules: {name} maps to unknown mesh axis {axis!r}; axes are {', '.join(MESH_AXES)}")
        if len(set(axes)) != len(axes):
            raise BadInput(f"partition rules: {name} lists a mesh axis twice ({', '.join(axes)}); name each axis once")
        if name == "layers" and axes:
            raise BadInput(
                f"partition rules: layers={target!r} would split a scanned model's stacked layers over devices, "
                "which the scan would gather back at every layer; leave layers null (its parameters split "
                "along embed, mlp, heads and vocab)"
            )
        rules[name] = _entry(axes)
    return rules


def state_shardings(tree, mesh: Mesh, rules: Mapping | None = None):
    """`param_shardings` for optimiser states too: a leaf whose annotation does not fit its
    shape (the empty placeholders ``optax.multi_transform`` keeps for another partition's
    parameters) falls back to the size-based default rule."""
    rules = DEFAULT_RULES if rules is None else rules

    def one(leaf):
        if isinstance(leaf, nnx.Variable):
            if not hasattr(leaf.get_value(), "shape"):
                return leaf  # an optax MaskedNode: no array, nothing to place
            names = leaf.get_metadata().get("out_sharding")
            shape = np.shape(leaf.get_value())
            if names and len(names) == len(shape) and all(shape):
                spec = logical_to_spec(names, mesh, rules, shape)
            else:
                spec = default_spec(shape, mesh)
            return leaf.replace(NamedSharding(mesh, spec))
        return NamedSharding(mesh, default_spec(np.shape(leaf), mesh))

    return jax.tree.map(one, tree, is_leaf=lambda x: isinstance(x, nnx.Variable))
