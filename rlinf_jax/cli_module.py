"""Command modules that are also the API functions of the same name.

``python -m rlinf_jax.train`` needs a module ``rlinf_jax.train``, and importing a submodule
makes Python set it as the package's attribute, so ``rlinf_jax.train`` is that module
whenever anything imported it, never the function. Rather than let ``rj.train(cfg)``
depend on import order, the command modules ``train`` and ``evaluate`` are callable: calling
the module calls `rlinf_jax.api`'s function of the same name.
"""

from __future__ import annotations

import sys
import types


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        from rlinf_jax import api

        return getattr(api, self.__name__.rpartition(".")[2])(*args, **kwargs)


def make_callable(module_name: str) -> None:
    """Makes the already-imported module ``module_name`` call its API function."""
    sys.modules[module_name].__class__ = _CallableModule
