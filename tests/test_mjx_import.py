"""MJX imported without its Warp backend for runs that do not use it (envs/mjx_import.py)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from rlinf_jax.config import load_config
from rlinf_jax.envs.mjx_import import uses_warp

PROBE = """
import sys
from rlinf_jax.envs.mjx_import import import_mjx
import_mjx(warp={warp})
from mujoco import mjx
import brax.envs
print("loaded", "warp" in sys.modules, mjx.warp.WARP_INSTALLED)
import warp  # a later import of Warp itself still works
print("later", "warp" in sys.modules)
"""


def _probe(warp: bool) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", PROBE.format(warp=warp)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.splitlines()


@pytest.mark.skipif(importlib.util.find_spec("warp") is None, reason="Warp is not installed, so MJX never imports it")
def test_a_run_without_warp_imports_mjx_and_brax_without_it_and_prints_nothing():
    # MJX's own "Failed to import warp" lines are swallowed: stdout holds only the probe's.
    assert _probe(False) == ["loaded False False", "later True"]
    assert _probe(True) == ["loaded True True", "later True"]


def test_only_a_playground_run_on_the_warp_backend_uses_warp():
    assert not uses_warp(load_config("ppo_brax"))
    assert not uses_warp(load_config("ppo_brax", ["env.suite=playground", "env.name=CartpoleBalance", "env.backend=jax"]))
    assert uses_warp(load_config("ppo_brax", ["env.suite=playground", "env.name=CartpoleBalance", "env.backend=warp"]))
