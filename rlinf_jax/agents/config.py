"""Settings of multi-turn agentic rollouts (the ``agent:`` section of a reasoning recipe)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlinf_jax.errors import BadInput

TOOLS = ("calculator", "search")
ADVANTAGE_MODES = ("trajectory", "turn")
ENVS = ("tools", "skyrl")
# agent.search_documents: the generated fact collection of data.source=tool_search.
FACTS = "facts"


@dataclass(frozen=True)
class TurnLimits:
    """How long an agentic episode may run: the one place the limits are checked. The
    environment ends an episode after ``max_turns`` model turns and the rollout runs at most
    as many, both read from here (`AgentConfig.limits`)."""

    max_turns: int = 4
    max_turn_tokens: int = 32  # model tokens per turn
    max_observation_tokens: int = 24  # tokens of one observation (longer ones are cut)
    max_episode_tokens: int = 128  # model + observation tokens after the prompt

    def __post_init__(self):
        for name in ("max_turns", "max_turn_tokens", "max_observation_tokens", "max_episode_tokens"):
            if getattr(self, name) < 1:
                raise BadInput(f"agent.{name}={getattr(self, name)} must be >= 1")


@dataclass
class AgentConfig:
    # Off: the single-turn reasoning rollout. On: episodes of model turns and tool results.
    enabled: bool = False
    # The episodes' environment: "tools" (`ToolEnv`: tool calls, then an answer the math
    # checker scores) or "skyrl" (a SkyRL-gym environment, the `skyrl` extra: `agents/skyrl.py`).
    env: str = "tools"
    # env=skyrl: the registered SkyRL-gym id (e.g. gsm8k_multi_turn) and its env_config.
    skyrl_env: str = ""
    skyrl_env_config: dict[str, Any] = field(default_factory=dict)
    # Tools the model may call (<tool>name: arguments</tool>); empty = no tools (a call is an
    # error observation), the control for "does the tool help".
    tools: list[str] = field(default_factory=lambda: ["calculator"])
    # The search tool's collection: a folder of .txt/.md files, a .jsonl with "text", or
    # "facts" (the generated towns of data.source=tool_search, `data/search_tasks.py`).
    search_documents: str = ""
    search_top_k: int = 1
    # Model turns per episode; tokens per model turn; tokens of one tool observation (longer
    # ones are cut); tokens of the whole episode after the prompt (model + observations).
    max_turns: int = 4
    max_turn_tokens: int = 32
    max_observation_tokens: int = 24
    max_episode_tokens: int = 128
    # Each tool call's time limit, and the tool worker processes (0 = in this process).
    tool_timeout_s: float = 2.0
    num_workers: int = 1
    # GRPO over episodes ("trajectory") or over every turn of a group (RLinf's grpo_dynamic "turn").
    advantage_mode: str = "trajectory"

    def validate(self) -> AgentConfig:
        if self.env not in ENVS:
            raise BadInput(f"agent.env={self.env!r}; use one of {', '.join(ENVS)}")
        if self.env == "skyrl" and not self.skyrl_env:
            raise BadInput("agent.env=skyrl needs agent.skyrl_env, a registered SkyRL-gym id such as gsm8k_multi_turn")
        unknown = [t for t in self.tools if t not in TOOLS]
        if unknown:
            raise BadInput(f"agent.tools has unknown tools {unknown}; choose from {', '.join(TOOLS)}")
        if "search" in self.tools and not self.search_documents:
            raise BadInput("agent.tools has search but agent.search_documents is empty; point it at the documents")
        self.limits()
        if self.search_top_k < 1:
            raise BadInput(f"agent.search_top_k={self.search_top_k} must be >= 1")
        if self.tool_timeout_s <= 0:
            raise BadInput(f"agent.tool_timeout_s={self.tool_timeout_s} must be positive")
        if self.num_workers < 0:
            raise BadInput(f"agent.num_workers={self.num_workers} must be >= 0 (0 = in this process)")
        if self.advantage_mode not in ADVANTAGE_MODES:
            raise BadInput(f"agent.advantage_mode={self.advantage_mode!r}; use one of {', '.join(ADVANTAGE_MODES)}")
        return self

    def limits(self) -> TurnLimits:
        """The episode limits, checked (the environment and the rollout read them from here)."""
        return TurnLimits(self.max_turns, self.max_turn_tokens, self.max_observation_tokens, self.max_episode_tokens)
