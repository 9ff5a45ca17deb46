"""The plain-text syntax of tool calls and their results.

A model turn that calls a tool ends with::

    <tool>NAME: ARGUMENTS</tool>

and the environment answers with one observation appended to the conversation::

    <result>TEXT</result>          the tool's output
    <error>TEXT</error>            a malformed call, an unknown tool, a tool that failed or timed out

A turn without ``<tool>`` is the final answer. The rollout stops generation at
`CALL_CLOSE` (and at the end token), so a turn holds at most one call; a turn that opens
``<tool>`` and is cut before closing it is a format error. Only the last call of a turn is
run (Search-R1 and RLinf's tool parsers also take the call the turn ends with).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CALL_OPEN, CALL_CLOSE = "<tool>", "</tool>"
RESULT_OPEN, RESULT_CLOSE = "<result>", "</result>"
ERROR_OPEN, ERROR_CLOSE = "<error>", "</error>"
MAX_ARGUMENT_CHARS = 500
# Longer than any real tool's name; a model that writes a long name gets a short error back.
MAX_NAME_CHARS = 64

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str


@dataclass(frozen=True)
class FormatError:
    message: str


def parse_turn(text: str) -> ToolCall | FormatError | None:
    """The call a model turn ends with, a `FormatError`, or None (no call: a final answer)."""
    start = text.rfind(CALL_OPEN)
    if start < 0:
        return FormatError(f"{CALL_CLOSE} without {CALL_OPEN}") if CALL_CLOSE in text else None
    body_start = start + len(CALL_OPEN)
    end = text.find(CALL_CLOSE, body_start)
    if end < 0:
        return FormatError(f"unterminated tool call: close it with {CALL_CLOSE}")
    body = text[body_start:end]
    name, colon, arguments = body.partition(":")
    name = name.strip()
    if colon and len(name) > MAX_NAME_CHARS:
        return FormatError(f"tool name longer than {MAX_NAME_CHARS} characters")
    if not colon or not _NAME.fullmatch(name):
        return FormatError(f"malformed tool call; write {CALL_OPEN}name: arguments{CALL_CLOSE}")
    if len(arguments) > MAX_ARGUMENT_CHARS:
        return FormatError(f"tool arguments longer than {MAX_ARGUMENT_CHARS} characters")
    return ToolCall(name, arguments.strip())


def result_text(output: str) -> str:
    return f"{RESULT_OPEN}{output}{RESULT_CLOSE}"


def error_text(message: str) -> str:
    return f"{ERROR_OPEN}{message}{ERROR_CLOSE}"
