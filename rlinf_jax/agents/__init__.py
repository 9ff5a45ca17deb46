"""Agentic RL on the host: text environments, tools, their plain-text call syntax, and the
settings of multi-turn rollouts. No JAX here (tool worker processes import this package).
"""

from rlinf_jax.agents.calculator import CalculatorError, calculator, evaluate
from rlinf_jax.agents.config import AgentConfig
from rlinf_jax.agents.env import StepResult, TextEnv, ToolEnv, step_batch
from rlinf_jax.agents.search import SearchTool, load_documents
from rlinf_jax.agents.skyrl import SkyRLTextEnv
from rlinf_jax.agents.syntax import CALL_CLOSE, CALL_OPEN, FormatError, ToolCall, parse_turn
from rlinf_jax.agents.tools import (
    Tool,
    ToolBox,
    ToolExecutor,
    ToolOutcome,
    calculator_tool,
    executor_from_config,
    search_tool,
)

__all__ = [
    "CALL_CLOSE", "CALL_OPEN", "AgentConfig", "CalculatorError", "FormatError", "SearchTool", "SkyRLTextEnv", "StepResult",
    "TextEnv", "Tool", "ToolBox", "ToolCall", "ToolEnv", "ToolExecutor", "ToolOutcome", "calculator",
    "calculator_tool", "evaluate", "executor_from_config", "load_documents", "parse_turn", "search_tool", "step_batch",
]
