"""Text environments: one episode per prompt row, text in and text out.

The protocol (`TextEnv`) has the shape of SkyRL-gym's ``BaseTextEnv`` (``init`` /
``step`` returning observations, reward, done, metadata) and of veRL's interaction
interface, reduced to strings so an environment ports by renaming:

- ``reset(row) -> str``: start an episode for a data row (a dict with at least ``prompt``);
  the text returned is the first observation, i.e. the prompt the model continues.
- ``step(model_text) -> StepResult(observation, reward, done, info)``: the model's turn in;
  the text to append to the conversation (empty when done) and the turn's reward out.
- ``max_turns``: the episode ends after this many model turns whatever the model does.

The token budget of an episode is the rollout's (`rlinf_jax.rollout.multi_turn`): it
counts tokens, which an environment does not see.

`ToolEnv` is the built-in environment: the model may call tools (`rlinf_jax.agents.syntax`)
and ends with an answer, scored against the row's ``answer`` by the reward's checker.
`step_batch` steps many environments at once and sends every tool call of the batch to the
worker pool in one go.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, runtime_checkable

from rlinf_jax.agents.syntax import FormatError, ToolCall, error_text, parse_turn, result_text
from rlinf_jax.agents.tools import ToolExecutor, ToolOutcome
from rlinf_jax.errors import BadInput
from rlinf_jax.rewards.answers import MathAnswerChecker


@dataclass
class StepResult:
    observation: str
    reward: float
    done: bool
    info: dict = field(default_factory=dict)


@runtime_checkable
class TextEnv(Protocol):
    max_turns: int

    def reset(self, row: dict) -> str: ...

    def step(self, model_text: str) -> StepResult: ...


class ToolEnv:
    """Tool use, then a final answer.

    A turn ending in a tool call gets the tool's result (or an error) as its observation and
    reward 0; a malformed call gets an error observation and the episode goes on (the model
    may correct itself; it is counted as a format error); a turn without a call is the final
    answer, scored ``checker(answer_text, row["answer"])`` in [0, 1]. When the model is
    still calling tools at ``max_turns`` the episode ends with reward 0 (``truncated``).

    ``executor`` is shared by the environments of a batch (`step_batch` gives it all their
    calls at once); ``checker`` defaults to the math checker's in-process integer path with
    the last-number fallback.
    """

    def __init__(self, executor: ToolExecutor, max_turns: int = 4, checker: Callable[[str, str], float] | None = None):
        self.executor, self.max_turns = executor, int(max_turns)  # checked with the limits (`TurnLimits`)
        self.checker = checker if checker is not None else _default_checker
        self.answer, self.turn = None, 0

    def reset(self, row: dict) -> str:
        if "prompt" not in row:
            raise BadInput("a tool environment row needs a 'prompt'")
        self.answer, self.turn = str(row.get("answer", "")), 0
        return str(row["prompt"])

    def plan(self, model_text: str) -> ToolCall | FormatError | None:
        """What the turn asks for: a call to run, a format error, or None (final answer)."""
        return parse_turn(model_text)

    def resolve(self, model_text: str, plan, outcome: ToolOutcome | None) -> StepResult:
        """The step's result once ``plan``'s call (if any) has run as ``outcome``."""
        self.turn += 1
        last = self.turn >= self.max_turns
        info = {"tool_call": False, "tool_error": False, "format_error": False, "timeout": False, "truncated": False}
        if plan is None:
            return StepResult("", float(self.checker(model_text, self.answer)), True, info)
        if isinstance(plan, FormatError):
            info["format_error"] = True
            obs = error_text(plan.message)
        else:
            info["tool_call"] = True
            info["tool_error"] = not outcome.ok
            info["timeout"] = outcome.timed_out
            obs = result_text(outcome.text) if outcome.ok else error_text(outcome.text)
        if last:
            info["truncated"] = True
            return StepResult("", 0.0, True, info)
        return StepResult(obs, 0.0, False, info)

    def step(self, model_text: str) -> StepResult:
        plan = self.plan(model_text)
        outcome = self.executor.run([plan])[0] if isinstance(plan, ToolCall) else None
        return self.resolve(model_text, plan, outcome)


def _default_checker(response: str, answer: str) -> float:
    checker = MathAnswerChecker("last_number")
    fast = checker.fast(response, answer)
    return float(fast) if fast is not None else 0.0


def step_batch(envs, texts) -> list[StepResult]:
    """``env.step(text)`` for each pair; the tool calls of `ToolEnv`s sharing an executor run
    as one batch in its pool (other environments step one by one)."""
    if len(envs) != len(texts):
        raise ValueError(f"{len(envs)} environments but {len(texts)} texts")
    results: list = [None] * len(envs)
    pending: dict[int, list] = {}  # id(executor) -> [(row, plan)]
    executors = {}
    plans = {}
    for i, (env, text) in enumerate(zip(envs, texts)):
        if isinstance(env, ToolEnv):
            plans[i] = env.plan(text)
            if isinstance(plans[i], ToolCall):
                executors[id(env.executor)] = env.executor
                pending.setdefault(id(env.executor), []).append(i)
        else:
            results[i] = env.step(text)
    outcomes: dict[int, ToolOutcome] = {}
    for key, rows in pending.items():
        for i, out in zip(rows, executors[key].run([plans[i] for i in rows])):
            outcomes[i] = out
    for i, plan in plans.items():
        results[i] = envs[i].resolve(texts[i], plan, outcomes.get(i))
    return results
