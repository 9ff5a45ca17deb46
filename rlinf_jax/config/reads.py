"""Keys a run would ignore: refused when the user set them, reported when a base recipe did.

The schema is the union of every task's keys; each task declares which of them it reads
(`Reads`). A key set in the recipe itself or in an override that the task does not read
is bad input, since it would silently change nothing. A key inherited from a ``base:``
recipe (a VLA SFT recipe building on the PPO recipe of the same model, say) is allowed,
and the keys of that kind whose values differ from the defaults are named in one warning.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlinf_jax.config.loader import Origins
from rlinf_jax.config.schema import Config
from rlinf_jax.errors import BadInput


@dataclass(frozen=True)
class Reads:
    """The keys a run reads: dotted paths, or ``section.*`` for a whole section."""

    keys: frozenset[str]
    # key -> what to use instead, for the keys users most often set on the wrong task
    hints: dict[str, str] = field(default_factory=dict)

    def __contains__(self, path: str) -> bool:
        parts = path.split(".")
        return path in self.keys or any(".".join(parts[:i]) + ".*" in self.keys for i in range(1, len(parts)))


def _default(path: str):
    node = Config()
    for part in path.split("."):
        node = getattr(node, part)
    return node


def _value(cfg: Config, path: str):
    node = cfg
    for part in path.split("."):
        node = getattr(node, part)
    return node


def check_reads(cfg: Config, origins: Origins, reads: Reads, who: str) -> str | None:
    """Raises `BadInput` for the first explicitly set key ``reads`` lacks; returns one
    warning line for inherited keys it lacks whose values are not the defaults (else None).
    ``who`` names the run in messages, e.g. "an embodied run"."""
    for path, where in origins.explicit.items():
        if path not in reads:
            hint = reads.hints.get(path, "it would have no effect")
            raise BadInput(f"{path} {where} is not read by {who}: {hint}; remove it")
    ignored = sorted(
        path for path in origins.inherited if path not in reads and _value(cfg, path) != _default(path)
    )
    if not ignored:
        return None
    bases = sorted({origins.inherited[p].removeprefix("in recipe ") for p in ignored})
    return f"{who} does not read {', '.join(ignored)} (set in {', '.join(bases)}); they have no effect"

