"""rlinf-jax: JAX-first reinforcement learning on device meshes.

The public API (`rlinf_jax.api`) is reachable from here, loaded on first use so that
``import rlinf_jax`` stays cheap (the CLIs answer ``--help`` before JAX loads)::

    import rlinf_jax as rj
    result = rj.train(rj.load_config("ppo_brax", ["runner.max_steps=20"]))
"""

from __future__ import annotations

import importlib

from rlinf_jax.accelerators import quiet_cpu_default

__version__ = "0.1.0"

# Before anything starts a JAX backend: libtpu's start-up chatter on machines without TPUs.
quiet_cpu_default()

_API = (
    "Config", "LMSampler", "Metrics", "TrainResult", "convert", "evaluate", "list_envs", "list_recipes", "load_config",
    "make_env", "plan", "read_metrics", "restore", "train",
)
_ELSEWHERE = {"BadInput": "rlinf_jax.errors", "TrainingDiverged": "rlinf_jax.flow.host_loop"}

__all__ = [*_API, *_ELSEWHERE, "__version__"]


# Also command modules (`python -m rlinf_jax.train`, `.evaluate`, `.convert`): the module is what the package holds
# once imported, so it is made callable as the function (rlinf_jax.api.make_callable).
_COMMANDS = ("train", "evaluate", "convert", "plan")


def __getattr__(name: str):
    if name in _COMMANDS:
        return importlib.import_module(f"rlinf_jax.{name}")
    if name in _API:
        module = "rlinf_jax.api"
    elif name in _ELSEWHERE:
        module = _ELSEWHERE[name]
    else:
        raise AttributeError(f"module 'rlinf_jax' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
