"""Shape annotations of the pytrees the runners carry (jaxtyping), and a check of real ones.

The state and batch dataclasses annotate their array fields with `jaxtyping`, so that a
reader sees each field's dtype and axes where it is declared. The names follow one
convention:

- ``*runs``: the leading axes of a run's own state: none for one run, ``[seeds]`` when
  `runner.seeds` trains several side by side (`flow.seeds.SeedBatch` stacks every leaf).
- ``*batch``: an env state's leading axes, ``[envs]`` (``[seeds, envs]`` side by side).
- ``*steps``: a `Transition`'s: ``[envs]`` for one step, ``[time, envs]`` once a scan
  stacks the steps.
- ``*rows``: a `TransitionBatch`'s: ``[n]`` sampled, ``[envs, time]`` in the replay ring.
- ``obs`` / ``act``: the observation and action sizes of a flat (state-based) env.

The seed axis, where there is one, leads each of them.

The annotations are not checked as the objects are built: JAX rebuilds these dataclasses
with other leaves (shardings, vmap axes, abstract values), which must stay possible.
`check` checks real instances instead, binding each name once across all the objects it
is given, so that ``obs`` is the same size in the env state, the transitions and the
batch. The tests run it on the states of every runner.
"""

from __future__ import annotations

import dataclasses
import types
import typing

from jaxtyping import AbstractArray, Array, Float, Int32, Shaped, UInt32, jaxtyped

__all__ = ["Array", "Count", "Float", "Int32", "Key", "Observation", "ShapeMismatch", "Shaped", "UInt32", "check"]

# A run's counters (iterations, gradient steps, skipped updates): one per run.
Count = Int32[Array, "*runs"]
# A legacy uint32[2] PRNG key per run: a plain array, so checkpoints need no key codec.
Key = UInt32[Array, "*runs 2"]
# Flat observations; structured ones (camera images and state of the VLA tabletop) are a dict.
Observation = Float[Array, "*batch obs"] | dict[str, Array]


class ShapeMismatch(TypeError):
    """A field's array does not have the dtype or axes its annotation names."""


def check(*trees) -> None:
    """Checks the annotated array fields of ``trees`` (dataclass instances, nested ones
    included) against their annotations; a dimension name binds to one size across all of
    them. Raises `ShapeMismatch` naming the field, its shape and dtype, and the annotation."""
    with jaxtyped("context"):
        for i, tree in enumerate(trees):
            _check(tree, type(tree).__name__ if len(trees) == 1 else f"[{i}] {type(tree).__name__}")


def _check(obj, path: str) -> None:
    hints = typing.get_type_hints(type(obj))
    for field in dataclasses.fields(obj):
        value, hint = getattr(obj, field.name), hints.get(field.name)
        where = f"{path}.{field.name}"
        if _names_an_array(hint):
            if not _matches(value, hint):
                shape = getattr(value, "shape", None)
                dtype = getattr(value, "dtype", type(value).__name__)
                found = f"{dtype}{list(shape) if shape is not None else ''}"
                raise ShapeMismatch(
                    f"{where}: {found} is not {_described(hint)}, or its axes disagree with the fields before it"
                )
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            _check(value, where)


def _matches(value, hint) -> bool:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return any(_matches(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    origin = typing.get_origin(hint)  # dict[str, Array]: the container only
    return isinstance(value, origin if origin is not None else hint)


def _described(hint) -> str:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return " | ".join(_described(arg) for arg in typing.get_args(hint))
    if isinstance(hint, type) and issubclass(hint, AbstractArray):
        kind = hint.__name__.partition("[")[0]
        return f"{kind}[{hint.dim_str!r}]"  # e.g. Float['*batch obs']
    return getattr(hint, "__name__", str(hint))


def _names_an_array(hint) -> bool:
    if isinstance(hint, type) and issubclass(hint, AbstractArray):
        return True
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return any(_names_an_array(arg) for arg in typing.get_args(hint))
    return False
