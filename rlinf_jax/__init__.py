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

# `train`, `evaluate`, `convert` and `plan` are also commands (`python -m rlinf_jax.train`); those
# modules are only run, never imported, so the names here are always the functions (rlinf_jax.cli).
_API = (
    "Config", "LMSampler", "Metrics", "TrainResult", "convert", "evaluate", "list_envs", "list_recipes", "load_config",
    "make_env", "plan", "read_metrics", "restore", "train",
)
_ELSEWHERE = {"BadInput": "rlinf_jax.errors", "TrainingDiverged": "rlinf_jax.flow.host_loop"}

__all__ = [*_API, *_ELSEWHERE, "__version__"]


def __getattr__(name: str):
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
