"""Tools as plain callables with a schema, and where their calls run.

A `Tool` is a name, a one-line description, a JSON-schema of its single text argument (the
shape veRL's and OpenAI's function schemas take, so a tool list can be shown to a chat
template) and a callable ``str -> str``. A `ToolBox` holds a run's tools by name; it is the
one picklable function the worker pool runs, ``toolbox(name, arguments)``, so each tool
worker unpickles the tools once and keeps what they build (the search index) across calls.

Calls run in `rlinf_jax.rewards.pool.CheckerPool`: the worker processes and per-call time
limits of the math checker (a soft alarm inside the call, a hard kill past the grace
period). Every outcome is text for the model: a result, or an error observation for an
unknown tool, a tool that raised, or one that ran out of time. Nothing a tool does raises in
the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from rlinf_jax.agents.calculator import calculator
from rlinf_jax.agents.config import FACTS
from rlinf_jax.agents.search import SearchTool
from rlinf_jax.agents.syntax import MAX_NAME_CHARS, ToolCall
from rlinf_jax.data.search_tasks import fact_documents
from rlinf_jax.errors import BadInput
from rlinf_jax.rewards.pool import CheckerPool, call_with_timeout

MAX_OUTPUT_CHARS = 1000


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    fn: Callable[[str], str]
    parameters: dict = field(default_factory=lambda: {"type": "string"})
    preload: tuple = ()  # modules a tool worker imports at start (not charged to a call)

    def schema(self) -> dict:
        """The OpenAI / veRL function-schema form of this tool."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {"type": "object", "properties": {"input": self.parameters}, "required": ["input"]},
            },
        }


def calculator_tool() -> Tool:
    return Tool(
        "calculator",
        "Exact arithmetic on numbers with + - * / and parentheses, e.g. 12*(3+4).",
        calculator,
        {"type": "string", "description": "an arithmetic expression"},
    )


def search_tool(search) -> Tool:
    """``search``: a `rlinf_jax.agents.search.SearchTool` (or any ``str -> str``)."""
    return Tool(
        "search",
        "Search the local document collection; returns the best matching passage.",
        search,
        {"type": "string", "description": "a search query"},
        preload=("bm25s",),
    )


class ToolBox:
    """The tools of a run by name; ``toolbox(name, arguments) -> output text`` (raises for an
    unknown tool or a tool's own failure; the executor turns either into an error)."""

    def __init__(self, tools):
        self.tools = {}
        for t in tools:
            if len(t.name) > MAX_NAME_CHARS:
                raise BadInput(
                    f"tool name {_shown(t.name)} is longer than {MAX_NAME_CHARS} characters, more than a call may "
                    "name; shorten it"
                )
            if t.name in self.tools:
                raise BadInput(f"two tools are named {t.name!r}")
            self.tools[t.name] = t

    def __call__(self, name: str, arguments: str) -> str:
        tool = self.tools.get(name)
        if tool is None:
            raise LookupError(f"unknown tool {_shown(name)}; tools: {', '.join(sorted(self.tools)) or 'none'}")
        out = tool.fn(arguments)
        if not isinstance(out, str):
            raise TypeError(f"tool {name!r} returned {type(out).__name__}, not text")
        return out[:MAX_OUTPUT_CHARS]

    def prepare(self) -> None:
        """Each tool's one-off set-up (a search index), outside any call's time limit: a
        tool with a ``prepare()`` method has it called (worker processes do it as they
        unpickle the tools)."""
        for t in self.tools.values():
            getattr(t.fn, "prepare", lambda: None)()

    def preload(self) -> tuple[str, ...]:
        return ("rlinf_jax.agents", *sorted({m for t in self.tools.values() for m in t.preload}))

    def schemas(self) -> list[dict]:
        return [t.schema() for t in self.tools.values()]


def _shown(name: str) -> str:
    """``name`` quoted for an error, cut to `MAX_NAME_CHARS` (the model reads what is echoed)."""
    return repr(name) if len(name) <= MAX_NAME_CHARS else f"{name[:MAX_NAME_CHARS]!r}..."


@dataclass(frozen=True)
class ToolOutcome:
    ok: bool
    text: str  # the tool's output, or what went wrong
    timed_out: bool = False


class ToolExecutor:
    """Runs batches of calls: ``run([ToolCall]) -> [ToolOutcome]`` in order.

    ``num_workers=0`` runs calls in this process under the soft alarm only (tests, trusted
    tools); otherwise in a `CheckerPool` started on first use. Close with ``close()``.
    """

    def __init__(self, toolbox: ToolBox, num_workers: int = 1, timeout_s: float = 2.0):
        if timeout_s <= 0:
            raise BadInput(f"the tool time limit must be positive, got {timeout_s}")
        self.toolbox, self.num_workers, self.timeout_s = toolbox, int(num_workers), float(timeout_s)
        self._pool: CheckerPool | None = None
        self._prepared = False

    def run(self, calls: list[ToolCall]) -> list[ToolOutcome]:
        if not calls:
            return []
        items = [(c.name, c.arguments) for c in calls]
        if self.num_workers == 0:
            if not self._prepared:
                self.toolbox.prepare()
                self._prepared = True
            raw = [call_with_timeout(self.toolbox, it, self.timeout_s) for it in items]
        else:
            if self._pool is None:
                self._pool = CheckerPool(self.num_workers, self.timeout_s, grace_s=1.0, preload=self.toolbox.preload())
            raw = self._pool.map(self.toolbox, items)
        out = []
        for status, value in raw:
            if status == "ok":
                out.append(ToolOutcome(True, value))
            elif status == "timeout":
                out.append(ToolOutcome(False, f"tool timed out after {self.timeout_s:g} s", timed_out=True))
            else:
                out.append(ToolOutcome(False, str(value)))
        return out

    def close(self):
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def executor_from_config(cfg) -> ToolExecutor:
    """The tool executor an ``agent:`` section (`AgentConfig`) describes; ``tools: []`` gives an
    executor whose every call is an unknown-tool error (the no-tool control)."""
    from_names = {"calculator": calculator_tool}
    tools = []
    for name in cfg.tools:
        if name == "search" and cfg.search_documents == FACTS:
            tools.append(search_tool(SearchTool(fact_documents(), cfg.search_top_k)))
        elif name == "search":
            tools.append(search_tool(SearchTool.from_path(cfg.search_documents, cfg.search_top_k)))
        else:
            tools.append(from_names[name]())
    return ToolExecutor(ToolBox(tools), cfg.num_workers, cfg.tool_timeout_s)
