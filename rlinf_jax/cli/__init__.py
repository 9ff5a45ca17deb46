"""The command-line programs' code: `train`, `evaluate`, `convert` and `plan`, each a ``main(argv)``
that parses its arguments, runs and returns an exit code (0 done, 1 the run failed or did not
fit, 2 bad input). ``python -m rlinf_jax.<name>`` runs them; these modules keep the names
free in the package, where ``rlinf_jax.train`` and the others are the API's functions.
"""

from __future__ import annotations

import importlib
import sys


def run_command(module_name: str) -> None:
    """What ``rlinf_jax/<name>.py`` does: under ``python -m`` (``module_name`` is
    ``"__main__"``) it runs ``rlinf_jax.cli.<name>.main`` and exits with its code; imported,
    it raises, because the import would make the package's ``<name>`` this module instead
    of the API's function."""
    spec = sys.modules[module_name].__spec__
    name = spec.name.rpartition(".")[2] if spec is not None else module_name
    if module_name != "__main__":
        raise ImportError(
            f"rlinf_jax.{name} is the command `python -m rlinf_jax.{name}`, not a module to import: call "
            f"rlinf_jax.{name}(...) (the function), or import rlinf_jax.cli.{name} for its main()"
        )
    sys.exit(importlib.import_module(f"rlinf_jax.cli.{name}").main())
