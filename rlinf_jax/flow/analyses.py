"""What a target's compiler said about a program, kept on disk by the program's text.

Planning compiles every program of an iteration for the target's chips: for a TPU, libtpu's
whole compiler (seconds for a tiny model, minutes at real sizes). JAX's persistent
compilation cache cannot keep those compiles, since a program compiled for abstract chips
has no executable to load back. What a plan reads from a compile is small: the memory
analysis, the per-chip cost analysis, or the compiler's out-of-memory refusal. `Analyses`
keeps exactly that, in one JSON file per program, so a plan run again (the same recipe, or
one knob changed) compiles only the programs whose text changed.

The key is everything the compiler's answer depends on: the lowered program's text (its
shapes, shardings and number of partitions; no source locations), the target's topology,
the ids of the chips the program is laid out on, the versions of JAX, jaxlib and libtpu,
the flags that change what XLA or libtpu produce (``XLA_FLAGS``, ``LIBTPU_INIT_ARGS``), and
JAX's compile settings that reach the compiler outside the program (optimization and
memory-fitting efforts and levels, the rematerialization pass). A file that cannot be read
is a miss, never an error.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from jax._src import config as jax_config  # the compile settings, as jax._src.compiler reads them

# Bumped when the fields below change meaning: older files are then misses.
FORMAT = 1


@dataclass(frozen=True)
class Analysis:
    """A compile's figures per chip (bytes, FLOPs), or its refusal."""

    argument_bytes: float = 0.0
    output_bytes: float = 0.0
    alias_bytes: float = 0.0
    temp_bytes: float = 0.0
    flops: float = 0.0
    bytes_accessed: float = 0.0
    refused: str = ""  # the compiler's out-of-memory line; temp_bytes is the figure it named

    @classmethod
    def of(cls, compiled, costs: bool = True) -> Analysis:
        """``compiled``'s memory analysis, and with ``costs`` its cost analysis."""
        mem = compiled.memory_analysis()
        costs = compiled.cost_analysis() if costs else {}
        if isinstance(costs, (list, tuple)):  # older JAX: one dict per computation
            costs = costs[0] if costs else {}
        costs = costs or {}
        return cls(float(mem.argument_size_in_bytes), float(mem.output_size_in_bytes),
                   float(mem.alias_size_in_bytes), float(mem.temp_size_in_bytes),
                   float(costs.get("flops", 0.0)), float(costs.get("bytes accessed", 0.0)))


def _compile_settings() -> list:
    """JAX's settings that `jax._src.compiler` hands the compiler beside the program (read
    from the same private states it reads; one missing in another JAX reads as None)."""
    names = ("exec_time_optimization_effort", "memory_fitting_effort", "optimization_level",
             "memory_fitting_level", "enable_remat_opt_pass", "jax_xla_profile_version")
    return [str(getattr(getattr(jax_config, n, None), "value", None)) for n in names]


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return ""


class Analyses:
    """The analyses of the programs compiled for one target, under ``directory``."""

    def __init__(self, directory: str | Path, target: str):
        self.directory = Path(directory).expanduser()
        self._context = json.dumps({
            "format": FORMAT, "target": target,
            "versions": [_version(p) for p in ("jax", "jaxlib", "libtpu")],
            "flags": [os.environ.get(v, "") for v in ("XLA_FLAGS", "LIBTPU_INIT_ARGS")],
            "settings": _compile_settings(),
        }, sort_keys=True)

    def key(self, lowered, device_ids) -> str:
        h = hashlib.sha256(self._context.encode())
        h.update(json.dumps(sorted(int(i) for i in device_ids)).encode())
        h.update(lowered.as_text(debug_info=False).encode())
        return h.hexdigest()

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def get(self, key: str) -> Analysis | None:
        try:
            fields = json.loads(self._path(key).read_text())
            return Analysis(**{k: str(v) if k == "refused" else float(v) for k, v in fields.items()})
        except (OSError, ValueError, TypeError, AttributeError):  # absent, torn or from another format
            return None

    def put(self, key: str, analysis: Analysis) -> None:
        """Written whole or not at all (a temporary file renamed into place), so planners
        running side by side never read half a file. A directory that cannot be written
        leaves the plan uncached, not failed."""
        tmp = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(dataclasses.asdict(analysis), f)
            os.replace(tmp, self._path(key))
            tmp = None
        except OSError:
            pass
        finally:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
