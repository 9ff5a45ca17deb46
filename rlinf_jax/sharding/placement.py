"""Component placement: which devices each component (env, rollout, actor, ...) runs on.

The syntax is RLinf's ``cluster.component_placement``: keys are comma-joined component
names, values are device ranks counted over all devices of all hosts:

    {"actor,rollout,env": "all"}                       collocated
    {"env": "0-3", "rollout": "4-7", "actor": "0-7"}   hybrid
    {"env": "0-1", "rollout": "2-3", "actor": "4-7"}   disaggregated

The mode follows from the sets: all identical = collocated; pairwise disjoint =
disaggregated; anything else = hybrid. A placement is plain data; meshes are built from
it per component (`component_mesh`), each with its own shape and axis names.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from rlinf_jax.errors import BadInput

MESH_AXES = ("data", "fsdp", "tensor")
MODES = ("collocated", "disaggregated", "hybrid")


def parse_ranks(spec, num_devices: int, where: str = "cluster.component_placement") -> tuple[int, ...]:
    """``all``, ``3``, ``0-3``, ``0,2,5`` or ``0-3,6`` -> sorted unique device ranks."""
    text = str(spec).strip()
    if text == "all":
        return tuple(range(num_devices))
    ranks: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if lo > hi:
                    raise ValueError
                ranks.update(range(lo, hi + 1))
            else:
                ranks.add(int(part))
        except ValueError:
            raise BadInput(
                f"{where}: cannot read device ranks {text!r}; use all, 3, 0-3, 0,2,5 or 0-3,6"
            ) from None
    bad = sorted(r for r in ranks if not 0 <= r < num_devices)
    if bad:
        raise BadInput(f"{where}: device rank {bad[0]} is out of range; {num_devices} device(s) exist (0-{num_devices - 1})")
    return tuple(sorted(ranks))


@dataclass(frozen=True)
class ComponentPlacement:
    devices: tuple[int, ...]
    mesh_shape: dict[str, int] = field(default_factory=dict)

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(self.mesh_shape)


@dataclass(frozen=True)
class Placement:
    mode: str
    components: dict[str, ComponentPlacement]
    # What the config asked for (a preset name or a mapping) and, for a preset, the
    # mapping it was expanded to: placement.json records both beside the result.
    requested: Any = None
    derived: dict | None = None
    # cluster.scaling=dynamic: a phase of the iteration that runs on more devices than its
    # component owns (the update on the actor's devices plus those the rollout frees), as
    # {phase: ComponentPlacement}; the component's own entry stays where its state lives
    # between phases.
    scaling: str = "static"
    phases: dict[str, ComponentPlacement] = field(default_factory=dict)

    def to_json(self) -> dict:
        out = {
            "mode": self.mode,
            "components": {
                name: {"devices": list(c.devices), "mesh_shape": dict(c.mesh_shape), "axis_names": list(c.axis_names)}
                for name, c in self.components.items()
            },
        }
        if self.requested is not None:
            out["requested"] = self.requested
        if self.derived is not None:
            out["derived"] = dict(self.derived)
        out["scaling"] = self.scaling
        if self.phases:
            out["phases"] = {
                name: {"devices": list(c.devices), "mesh_shape": dict(c.mesh_shape), "axis_names": list(c.axis_names)}
                for name, c in self.phases.items()
            }
        return out

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n")


def derive_mode(sets: dict[str, tuple[int, ...]]) -> str:
    """collocated: one device set for all; disaggregated: the distinct sets are pairwise
    disjoint (components sharing a set form one collocated group, e.g. env and rollout
    together, actor apart); hybrid: some distinct sets overlap."""
    groups = list({frozenset(s) for s in sets.values()})
    if len(groups) == 1:
        return "collocated"
    if all(a.isdisjoint(b) for i, a in enumerate(groups) for b in groups[i + 1 :]):
        return "disaggregated"
    return "hybrid"


def _span(lo: int, hi: int) -> str:
    return str(lo) if hi - lo == 1 else f"{lo}-{hi - 1}"


def preset(name: str, components: tuple[str, ...], num_devices: int) -> dict[str, str]:
    """Sensible splits of the devices; the last component is the learner (the actor).

    collocated: everything everywhere. disaggregated: the learner takes half the devices
    (rounded down) and the others split the rest into disjoint near-equal slices in the
    order given; on too few devices for that they share their half. hybrid: the learner
    spans all devices; the others split them into disjoint slices, or, when there is only
    one other (a reasoning run's rollout), it takes the first half (RLinf's shape:
    generation on part of the devices, the learner on all of them).
    """
    n = num_devices
    if name == "collocated":
        return {",".join(components): _span(0, n)}
    if name not in ("disaggregated", "hybrid"):
        raise BadInput(f"cluster.component_placement={name!r} is not a preset; choose collocated, disaggregated or hybrid, or give a mapping")
    *sharers, learner = components
    if not sharers:
        raise BadInput(
            f"cluster.component_placement={name} splits components over devices, and this run has one "
            f"({learner}); it runs collocated: drop the setting or set it to collocated"
        )
    if n < 2:
        raise BadInput(
            f"cluster.component_placement={name}: {len(components)} component(s) to split over {n} device(s); "
            "use collocated or more devices"
        )
    if name == "hybrid":
        lo_hi = (0, n) if len(sharers) > 1 else (0, n - n // 2)
        if len(sharers) > n:
            raise BadInput(f"cluster.component_placement=hybrid: {len(sharers)} component(s) to split over {n} device(s); use collocated or more devices")
        out = {}
    else:
        half = n // 2
        lo_hi = (0, n - half)
        out = {learner: _span(n - half, n)}
    lo, hi = lo_hi
    if len(sharers) > hi - lo:  # too few devices: the non-learners share theirs
        return {",".join(sharers): _span(lo, hi), **out}
    bounds = np.linspace(lo, hi, len(sharers) + 1).round().astype(int)
    split = {c: _span(a, b) for c, a, b in zip(sharers, bounds[:-1], bounds[1:])}
    if name == "hybrid":
        split[learner] = _span(0, n)
    return {**split, **out}


def resolve_placement(spec, components: tuple[str, ...], num_devices: int, meshes: dict | None = None) -> Placement:
    """Reads a placement (a preset name or a mapping) for exactly ``components``.

    ``meshes`` maps a component to its mesh shape, e.g. ``{"actor": {"data": 2, "fsdp": 2}}``;
    a component without one gets ``{"data": <its device count>}``.
    """
    requested = spec if isinstance(spec, str) else dict(spec)
    derived = None
    if isinstance(spec, str):
        spec = derived = preset(spec, components, num_devices)
    sets: dict[str, tuple[int, ...]] = {}
    for key, ranks in dict(spec).items():
        parsed = parse_ranks(ranks, num_devices, f"cluster.component_placement.{key}")
        for name in (n.strip() for n in str(key).split(",")):
            if name not in components:
                raise BadInput(f"cluster.component_placement: unknown component {name!r}; this recipe has {', '.join(components)}")
            if name in sets:
                raise BadInput(f"cluster.component_placement: component {name!r} is placed twice")
            sets[name] = parsed
    missing = [c for c in components if c not in sets]
    if missing:
        raise BadInput(f"cluster.component_placement: no devices for {', '.join(missing)}; every component needs a placement")

    meshes = dict(meshes or {})
    unknown = [c for c in meshes if c not in components]
    if unknown:
        raise BadInput(f"cluster.mesh: unknown component {unknown[0]!r}; this recipe has {', '.join(components)}")
    placed = {}
    for name in components:
        shape = _mesh_shape(name, dict(meshes.get(name) or {"data": len(sets[name])}), len(sets[name]))
        bad_axes = [a for a in shape if a not in MESH_AXES]
        if bad_axes:
            raise BadInput(f"cluster.mesh.{name}: unknown axis {bad_axes[0]!r}; axes are {', '.join(MESH_AXES)}")
        if any(v < 1 for v in shape.values()) or math.prod(shape.values()) != len(sets[name]):
            raise BadInput(
                f"cluster.mesh.{name}={shape} holds {math.prod(shape.values())} devices but {name} is placed on "
                f"{len(sets[name])}; make the axis sizes multiply to {len(sets[name])}"
            )
        placed[name] = ComponentPlacement(sets[name], shape)
    mode = derive_mode(sets)
    if derived is not None and mode != requested:
        raise BadInput(
            f"cluster.component_placement={requested}: on {num_devices} device(s) the components "
            f"{', '.join(components)} can only be placed {mode}; use more devices or a mapping"
        )
    return Placement(mode, placed, requested, derived)


def _mesh_shape(name: str, given: dict, num_devices: int) -> dict[str, int]:
    """A component's mesh axes as sizes; one axis may be ``all``: whatever the others leave of
    the component's devices (``{fsdp: all}`` spans a slice of any size)."""
    open_axes = [k for k, v in given.items() if str(v).strip() == "all"]
    if len(open_axes) > 1:
        raise BadInput(f"cluster.mesh.{name}: only one axis may be 'all' ({', '.join(map(str, open_axes))} are)")
    shape: dict[str, int] = {}
    for k, v in given.items():
        if str(v).strip() == "all":
            shape[str(k)] = 0
            continue
        try:
            shape[str(k)] = int(v)
        except (TypeError, ValueError):
            raise BadInput(f"cluster.mesh.{name}.{k}={v!r} must be a positive integer or 'all'") from None
    if open_axes:
        rest = math.prod(v for v in shape.values() if v) or 1
        if num_devices % rest:
            raise BadInput(f"cluster.mesh.{name}: the other axes ({rest} devices) do not divide its {num_devices} devices")
        shape[str(open_axes[0])] = num_devices // rest
    return shape


def grown_shape(shape: dict[str, int], num_devices: int, where: str) -> dict[str, int]:
    """A component's mesh shape stretched over ``num_devices`` (a multiple of its own count).

    The axis that grows is the one the component already splits its state over: ``fsdp``
    when it is larger than 1 (parameters and optimiser state stay sharded, so no device
    holds more than the component's own did), else ``data`` (added in front where absent).
    Every other axis keeps its size.
    """
    own = math.prod(shape.values())
    if num_devices == own:
        return dict(shape)
    order = ("fsdp", "data") if shape.get("fsdp", 1) > 1 else ("data", "fsdp")
    for axis in order:
        if axis not in shape and axis != "data":
            continue
        rest = own // shape.get(axis, 1)
        if num_devices % rest:
            continue
        size = num_devices // rest
        if axis in shape:
            return {k: size if k == axis else v for k, v in shape.items()}
        return {"data": size, **shape}
    raise BadInput(
        f"{where}: the mesh {shape} cannot stretch over {num_devices} devices (its other axes do not divide "
        f"{num_devices}); set cluster.mesh so that fsdp or data can grow, or use cluster.scaling=static"
    )


def with_phase(placement: Placement, phase: str, owner: str, borrowers: tuple[str, ...]) -> Placement:
    """``placement`` with cluster.scaling=dynamic's ``phase``: ``owner``'s devices plus those
    of ``borrowers`` (components idle during that phase and holding nothing the next phase
    needs), on ``owner``'s mesh grown over them (`grown_shape`).

    A placement where the phase would gain no device is refused: dynamic scaling has
    nothing to move there.
    """
    own = placement.components[owner]
    devices = tuple(sorted(set(own.devices).union(*(placement.components[b].devices for b in borrowers))))
    if devices == own.devices:
        raise BadInput(
            f"cluster.scaling=dynamic lends the devices of {', '.join(borrowers)} to the {owner} during its {phase}, "
            f"and in this {placement.mode} placement the {owner} already runs on all of them; use "
            "cluster.scaling=static, or a placement where they are apart (e.g. disaggregated)"
        )
    shape = grown_shape(dict(own.mesh_shape), len(devices), f"cluster.scaling=dynamic ({owner} {phase})")
    return dataclasses.replace(placement, scaling="dynamic",
                               phases={**placement.phases, phase: ComponentPlacement(devices, shape)})


def component_mesh(placement: Placement, name: str, devices=None):
    """A `jax.sharding.Mesh` over the component's devices with its axis names (Auto axes);
    ``name`` may also be a phase of cluster.scaling=dynamic (`with_phase`)."""
    devices = jax.devices() if devices is None else devices
    c = placement.phases[name] if name in placement.phases else placement.components[name]
    grid = np.array([devices[r] for r in c.devices]).reshape(tuple(c.mesh_shape.values()))
    return Mesh(grid, c.axis_names, axis_types=(AxisType.Auto,) * len(c.axis_names))
