"""Functional, batched environments: Brax and MuJoCo Playground behind one interface.

The names below load on first use (PEP 562): the suites import Brax and MuJoCo's MJX
(several seconds), which a run that only needs `envs.host` or `envs.normalization` (every
language-model run imports the task registry, which reaches both) should not pay for.
"""

from __future__ import annotations

import importlib

_WHERE = {
    "Env": "base",
    "EnvState": "base",
    "RunningStats": "normalization",
    "init_stats": "normalization",
    "normalize": "normalization",
    "update_stats": "normalization",
    "list_envs": "names",
    "make_env": "registry",
    "make_eval_env": "registry",
    "ActionRepeat": "wrappers",
    "AutoReset": "wrappers",
    "EpisodeStats": "wrappers",
    "TimeLimit": "wrappers",
    "VmapEnv": "wrappers",
    "Wrapper": "wrappers",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted({*globals(), *_WHERE})
