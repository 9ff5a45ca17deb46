"""The environment of each episode, as an ``agent:`` section (`AgentConfig`) names it."""

from __future__ import annotations

from typing import Callable

from rlinf_jax.agents.config import AgentConfig
from rlinf_jax.agents.env import TextEnv, ToolEnv
from rlinf_jax.agents.skyrl import SkyRLTextEnv, check_env_id
from rlinf_jax.agents.tools import ToolExecutor, executor_from_config


def uses_tools(cfg: AgentConfig) -> bool:
    """Whether the episodes call our tools (and so need a `ToolExecutor` and its workers)."""
    return cfg.env == "tools"


def tool_executor(cfg: AgentConfig) -> ToolExecutor | None:
    """The executor of the recipe's tools, or None where the environment brings its own."""
    return executor_from_config(cfg) if uses_tools(cfg) else None


def env_factory(cfg: AgentConfig, executor: ToolExecutor | None) -> Callable[[], TextEnv]:
    """``() -> a fresh environment`` for one episode; checks a SkyRL-gym id up front."""
    if uses_tools(cfg):
        if executor is None:
            raise ValueError("agent.env=tools needs the tool executor")
        return lambda: ToolEnv(executor, cfg.limits().max_turns)
    check_env_id(cfg.skyrl_env)
    return lambda: SkyRLTextEnv(cfg.skyrl_env, cfg.limits().max_turns, cfg.skyrl_env_config)
