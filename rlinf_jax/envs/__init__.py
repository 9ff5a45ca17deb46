"""Functional, batched environments: Brax and MuJoCo Playground behind one interface."""

from rlinf_jax.envs.base import Env, EnvState
from rlinf_jax.envs.normalization import RunningStats, init_stats, normalize, update_stats
from rlinf_jax.envs.registry import list_envs, make_env, make_eval_env
from rlinf_jax.envs.wrappers import ActionRepeat, AutoReset, EpisodeStats, TimeLimit, VmapEnv, Wrapper

__all__ = [
    "ActionRepeat",
    "AutoReset",
    "Env",
    "EnvState",
    "EpisodeStats",
    "RunningStats",
    "TimeLimit",
    "VmapEnv",
    "Wrapper",
    "init_stats",
    "list_envs",
    "make_env",
    "make_eval_env",
    "normalize",
    "update_stats",
]
