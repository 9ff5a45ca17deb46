"""The benchmark scripts run outside CI (they take minutes each), so nothing else notices
when a rename in the package leaves one of them importing a name that is gone: every
``from rlinf_jax... import name`` in benchmarks/ must name something that exists."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _package_imports():
    for path in sorted(BENCHMARKS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("rlinf_jax"):
                for alias in node.names:
                    yield f"{path.name}:{node.lineno}", node.module, alias.name


def _exists(module: str, name: str) -> bool:
    owner = importlib.import_module(module)
    if name == "*" or hasattr(owner, name):
        return True
    try:  # a submodule not imported yet
        importlib.import_module(f"{module}.{name}")
    except ImportError:
        return False
    return True


def test_every_name_a_benchmark_imports_from_the_package_exists():
    imports = list(_package_imports())
    assert len(imports) > 20  # the scan reads the scripts' imports at all
    missing = [f"{where}: from {module} import {name}" for where, module, name in imports if not _exists(module, name)]
    assert not missing, missing
