"""MuJoCo MJX, imported without its Warp backend when a run does not use it.

``import mujoco.mjx`` also imports NVIDIA Warp and MuJoCo Warp (installed beside
MuJoCo Playground) whenever they are installed: about as long again as MJX itself, paid by
every process that builds a Brax, Playground or tabletop env, though only
``env.suite=playground env.backend=warp`` steps through them. MJX handles a Warp it cannot
import (its JAX implementation is whole without it), so a run that does not use Warp
imports MJX with the two modules hidden, and the process starts seconds sooner. Nothing
else changes: a later ``import warp`` works as usual, only MJX's own Warp backend stays off
in this process.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import sys

WARP_MODULES = ("warp", "mujoco.mjx.third_party.mujoco_warp")


def uses_warp(cfg) -> bool:
    """Whether the run steps its env through MJX's Warp backend."""
    return cfg.env.suite == "playground" and cfg.env.backend == "warp"


def import_mjx(warp: bool) -> None:
    """Imports ``mujoco.mjx`` now, without its Warp backend unless ``warp``. A no-op when MJX
    or Warp is already imported (a notebook that imported Brax first keeps what it has)."""
    if warp or "mujoco.mjx" in sys.modules or any(m in sys.modules for m in WARP_MODULES):
        return
    for name in WARP_MODULES:
        sys.modules[name] = None  # an import of it raises ImportError, which MJX expects
    try:
        # MJX prints a line per module it could not import; here that is the point.
        with contextlib.redirect_stdout(io.StringIO()):
            importlib.import_module("mujoco.mjx")
    finally:
        for name in WARP_MODULES:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]
