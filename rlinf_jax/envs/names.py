"""Each suite's env names, known without importing its simulator.

Listing the envs (``python -m rlinf_jax.train --list-envs``, ``rj.list_envs()``) should not
cost the seconds that importing Brax and MuJoCo's MJX takes (both start JAX). Brax and
Playground's dm_control suite keep their registries as a dict literal, ``_envs = {...}``,
in one file each; its keys are read here with `ast`. Where a package's file is not laid
out that way (another version), the registry is imported instead. `tests/test_envs.py`
holds what is read here equal to the imported registries (`envs.registry.registered_envs`).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

# The tabletop's "envs" are its splits, training split first (`envs.tabletop.SPLITS`,
# which imports JAX; a test holds the two equal).
TABLETOP_SPLITS = ("train", "vision", "semantic", "execution")

# Where each suite's registry literal sits: (package, file inside it).
_REGISTRY_FILES = {
    "brax": ("brax", "envs/__init__.py"),
    "playground": ("mujoco_playground", "_src/dm_control_suite/__init__.py"),
}


def registry_literal_keys(package: str, relative: str, name: str = "_envs") -> list[str] | None:
    """The string keys of the dict literal assigned to ``name`` at the top of ``package``'s
    file ``relative``, read without importing the package; None when the package, the file
    or such a literal is not there."""
    spec = importlib.util.find_spec(package)  # a top-level package: found, not imported
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
            and isinstance(node.value, ast.Dict)
        ):
            keys = [k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            # Every key a string literal, or the literal is not the whole registry.
            return sorted(keys) if keys and len(keys) == len(node.value.keys) else None
    return None


def _imported_brax_names() -> list[str]:
    from brax import envs as brax_envs  # heavy (starts JAX): only when its file cannot be read

    return sorted(brax_envs._envs)


def _imported_playground_names() -> list[str]:
    from mujoco_playground import dm_control_suite  # heavy (MJX, JAX): only when its file cannot be read

    return sorted(dm_control_suite.ALL_ENVS)


_IMPORTED = {"brax": _imported_brax_names, "playground": _imported_playground_names}


def suite_names(suite: str) -> list[str]:
    """The sorted env names of ``suite`` (brax | playground | tabletop)."""
    if suite == "tabletop":
        return list(TABLETOP_SPLITS)
    read = registry_literal_keys(*_REGISTRY_FILES[suite])
    return read if read is not None else _IMPORTED[suite]()


def list_envs() -> dict[str, list[str]]:
    """Suite -> sorted env names (the tabletop's splits in their own order)."""
    return {suite: suite_names(suite) for suite in ("brax", "playground", "tabletop")}
