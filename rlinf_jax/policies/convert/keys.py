"""Declarative checkpoint key maps for the VLA converters, and the loop that applies them.

A ``Row`` pairs a source-key template with one parameter path (or several, for a fused
tensor that is split) and a layout transform; a ``Skip`` names source keys that are
deliberately left out, with the reason. ``read_checkpoint`` streams the safetensors files
and requires every tensor to be consumed by a row or skipped by name: a leftover key is a
``BadInput`` naming it, as is a parameter no tensor filled, a shape that does not fit, or a
tensor seen twice. Nothing is dropped silently.

Templates name their variable parts: ``{layer}`` (digits) and ``{proj}`` (lower-case
letters) as in ``policies.lm.keymap``.

Transforms (torch layout -> ours):
- ``""``: as is;
- ``"T"``: transpose a ``[out, in]`` linear weight to our ``[in, out]`` kernel;
- ``"conv"``: a ``[D, C, P, P]`` convolution weight to a ``[P, P, C, D]`` patch kernel;
- ``"flat"``: drop leading size-1 axes (``[1, N, D]`` position tables, ``[1, 1, D]`` tokens)
  down to the target's rank.
A row with several targets splits the source into that many equal parts along axis 0
(torch's output axis) before the transform: fused ``qkv`` weights and biases.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm.hf_checkpoint import open_safetensors, weight_tensor

_FIELDS = {"layer": r"\d+", "proj": r"[a-z]+"}


def _regex(template: str) -> re.Pattern:
    parts = re.split(r"\{(\w+)\}", template)
    pattern = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>{_FIELDS[p]})" for i, p in enumerate(parts))
    return re.compile(pattern + r"\Z")


@dataclasses.dataclass(frozen=True)
class Row:
    src: str  # source-key template
    ours: str | tuple[str, ...]  # parameter path template(s); several = split the source
    transform: str = ""

    def match(self, key: str) -> tuple[str, ...] | None:
        m = _regex(self.src).match(key)
        if m is None:
            return None
        targets = (self.ours,) if isinstance(self.ours, str) else self.ours
        return tuple(t.format(**m.groupdict()) for t in targets)


@dataclasses.dataclass(frozen=True)
class Skip:
    """Source keys matching ``pattern`` (a regular expression on the whole key) are left out."""

    pattern: str
    reason: str

    def match(self, key: str) -> bool:
        return re.fullmatch(self.pattern, key) is not None


def prefixed(prefix: str, rows: Iterable[Row], ours_prefix: str = "") -> tuple[Row, ...]:
    """The same rows with ``prefix`` before each source key and ``ours_prefix`` before each path."""
    out = []
    for r in rows:
        ours = ours_prefix + r.ours if isinstance(r.ours, str) else tuple(ours_prefix + o for o in r.ours)
        out.append(Row(prefix + r.src, ours, r.transform))
    return tuple(out)


def apply(transform: str, array: np.ndarray, target_shape: tuple[int, ...]) -> np.ndarray:
    if transform == "":
        return array
    if transform == "T":
        return array.T
    if transform == "conv":
        return array.transpose(2, 3, 1, 0)
    if transform == "flat":
        extra = array.ndim - len(target_shape)
        if extra < 0 or any(s != 1 for s in array.shape[:extra]):
            return array  # the shape check reports it
        return array.reshape(array.shape[extra:])
    raise ValueError(f"unknown transform {transform!r}")


def match(key: str, rows: Iterable[Row], targets: Mapping[str, object] | None = None):
    """The first ``(row, parameter paths)`` for ``key`` (whose paths all exist in ``targets``
    when given), or None."""
    for row in rows:
        paths = row.match(key)
        if paths is not None and (targets is None or all(p in targets for p in paths)):
            return row, paths
    return None


def read_checkpoint(
    files: Iterable[Path],
    rows: Iterable[Row],
    skips: Iterable[Skip],
    targets: Mapping[str, object],
    what: str,
    dtype=None,
) -> dict[str, np.ndarray]:
    """``{parameter path: host array}`` for every path of ``targets`` (path -> anything with a
    ``.shape``), read from safetensors ``files``; ``what`` names the model in errors."""
    rows, skips = tuple(rows), tuple(skips)
    values: dict[str, np.ndarray] = {}
    source_of: dict[str, str] = {}
    leftover: list[str] = []
    for file in files:
        with open_safetensors(file) as f:
            for key in f.keys():  # noqa: SIM118 (safe_open handles are not iterable)
                if any(s.match(key) for s in skips):
                    continue
                found = match(key, rows, targets)
                if found is None:
                    leftover.append(key)
                    continue
                row, paths = found
                shape = tuple(f.get_slice(key).get_shape())
                if len(paths) > 1 and (not shape or shape[0] % len(paths)):
                    raise BadInput(
                        f"checkpoint tensor {key!r} {shape} does not split evenly into {len(paths)} parts along "
                        "its first axis; the checkpoint does not fit the config"
                    )
                array = weight_tensor(f, key, file)
                parts = np.split(array, len(paths), axis=0) if len(paths) > 1 else [array]
                for path, part in zip(paths, parts):
                    want = tuple(targets[path].shape)
                    out = apply(row.transform, part, want)
                    if tuple(out.shape) != want:
                        raise BadInput(
                            f"checkpoint tensor {key!r} has shape {tuple(array.shape)}, which does not fit "
                            f"{path} {want} of the {what} the config describes"
                        )
                    if path in values:
                        raise BadInput(f"checkpoint tensors {source_of[path]!r} and {key!r} both fill {path}")
                    values[path] = np.ascontiguousarray(out if dtype is None else out.astype(dtype))
                    source_of[path] = key
    if leftover:
        raise BadInput(
            f"checkpoint tensor {leftover[0]!r} has no place in the {what} the config describes "
            f"({len(leftover)} such tensor(s)); fix the config or remove them"
        )
    missing = [p for p in targets if p not in values]
    if missing:
        raise BadInput(
            f"checkpoint lacks {len(missing)} tensor(s) the {what} needs, e.g. parameters {', '.join(missing[:4])}"
        )
    return values
