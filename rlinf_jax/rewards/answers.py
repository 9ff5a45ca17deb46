"""Answer extraction and checking: is a response's final answer equal to the reference?

The final answer is the content of the response's *last* ``\\boxed{...}`` (braces balanced;
a model that boxes a scratch value and then the result means the result). Without a box the
``fallback`` decides: ``"last_number"`` takes the last number in the text, ``"math_verify"``
lets ``math-verify`` search the whole text with its own heuristics, ``"none"`` scores 0.

Equality is decided by ``math-verify`` (sympy underneath: ``\\frac{1}{2}`` = ``0.5`` = ``1/2``,
``3`` = ``3.0``, LaTeX, sets, intervals). It is slow for what the procedural task needs, so
``MathAnswerChecker.fast`` settles the common case in pure Python: an integer reference and an
integer-looking candidate compare as integers; anything else goes to ``math-verify``.

Everything here is linear in the response's length, and only the last ``MAX_SCAN_CHARS``
characters are looked at (a final answer sits at the end; a runaway response must not cost
the trainer more than one bounded pass). Integers are compared as digit strings, so a
5,000-digit answer is an answer, not Python's int-string limit.

This module imports neither JAX nor ``math-verify`` at the top: checker worker processes
import it, and should start in a fraction of a second.
"""

from __future__ import annotations

import functools
import logging
import re

FALLBACKS = ("last_number", "math_verify", "none")

_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
# A number as people write it: optional sign (not a minus between two operands), thousands
# groups, decimals, an optional /denominator.
_NUMBER = re.compile(r"(?:(?<![\w)\]}.])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?")
_INTEGER = re.compile(r"[+-]?\d+")
_INTEGER_LIKE = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.0*)?")


# Responses are scanned over their last this many characters (about 64k tokens of text).
MAX_SCAN_CHARS = 1 << 18
_BRACES = re.compile(r"[{}]")


def _tail(text: str) -> str:
    return text if len(text) <= MAX_SCAN_CHARS else text[-MAX_SCAN_CHARS:]


def boxed_contents(text: str) -> list[str]:
    """The contents of every ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``, in order of
    their openings (unterminated boxes are skipped).

    One pass over the braces with a stack of open ones: linear however many boxes are left
    open (scanning ahead from each opening, as a first version did, is quadratic on a
    response that repeats ``\\boxed{`` without closing it)."""
    text = _tail(text)
    box_starts = {m.end() - 1: m.end() for m in _BOX.finditer(text)}  # "{" position -> content start
    stack: list[int] = []
    found: list[tuple[int, str]] = []
    for m in _BRACES.finditer(text):
        pos = m.start()
        if text[pos] == "{":
            stack.append(pos)
        elif stack:
            opened = stack.pop()
            if opened in box_starts:
                start = box_starts[opened]
                found.append((start, text[start:pos]))
    return [content for _, content in sorted(found)]


def last_number(text: str) -> str | None:
    last = None
    for last in _NUMBER.finditer(_tail(text)):
        pass
    return last.group(0) if last is not None else None


def extract_answer(response: str, fallback: str = "last_number") -> str | None:
    """The candidate final answer of ``response``, or None (no box, and the fallback found
    nothing or is not ``"last_number"``)."""
    boxes = boxed_contents(response)
    if boxes:
        return boxes[-1]
    if fallback == "last_number":
        return last_number(response)
    return None


def format_ok(response: str, required_tag: str = "") -> bool:
    """Format reward's test: exactly one ``\\boxed{}``, and ``required_tag`` present if set."""
    return len(boxed_contents(response)) == 1 and (not required_tag or required_tag in response)


def _canonical_integer(text: str) -> str:
    """An integer's digits without sign noise or leading zeros ("-0" and "+007" -> "0", "7"):
    equal strings, equal integers, at any length (``int()`` refuses over 4,300 digits)."""
    digits = text.lstrip("+-").lstrip("0")
    if not digits:
        return "0"
    return "-" + digits if text.startswith("-") else digits


class _DropDisabledTimeoutWarning(logging.Filter):
    # We pass math-verify timeout=None on purpose (our alarm bounds the call; its alarm would
    # cancel ours), and it warns once per process that the timeout is off.
    def filter(self, record):
        return "Timeout is disabled" not in record.getMessage()


def _math_verify():
    import math_verify

    for name in ("math_verify.parser", "math_verify.grader"):
        lg = logging.getLogger(name)
        if not any(isinstance(f, _DropDisabledTimeoutWarning) for f in lg.filters):
            lg.addFilter(_DropDisabledTimeoutWarning())
    return math_verify


@functools.lru_cache(maxsize=4096)
def _parse_gold(answer: str):
    """The reference parsed once per process (a dataset repeats its answers every epoch)."""
    mv = _math_verify()
    gold = mv.parse("\\boxed{" + answer + "}", extraction_config=[mv.LatexExtractionConfig()], parsing_timeout=None)
    if not gold:
        gold = mv.parse(answer, parsing_timeout=None)
    return gold


class MathAnswerChecker:
    """``checker(response, answer) -> 1.0 | 0.0`` with ``math-verify``; picklable, so it runs
    in checker processes. ``fast(response, answer)`` returns the same score without
    ``math-verify`` when it can, else None."""

    def __init__(self, fallback: str = "last_number"):
        if fallback not in FALLBACKS:
            raise ValueError(f"fallback {fallback!r} is not one of {FALLBACKS}")
        self.fallback = fallback

    def fast(self, response: str, answer: str) -> float | None:
        if not _INTEGER.fullmatch(answer.strip()):
            return None
        cand = extract_answer(response, self.fallback)
        if cand is None:
            return None if self.fallback == "math_verify" else 0.0
        cand = cand.strip().strip("$").strip()
        if not _INTEGER_LIKE.fullmatch(cand):
            return None
        return float(_canonical_integer(cand.split(".")[0].replace(",", "")) == _canonical_integer(answer.strip()))

    def __call__(self, response: str, answer: str) -> float:
        mv = _math_verify()
        cand = extract_answer(response, self.fallback)
        if cand is None:
            if self.fallback != "math_verify" or not response.strip():
                return 0.0
            pred = mv.parse(response, parsing_timeout=None)
        else:
            pred = mv.parse("\\boxed{" + cand + "}", extraction_config=[mv.LatexExtractionConfig()], parsing_timeout=None)
        gold = _parse_gold(answer.strip())
        if not gold:
            # A reference math-verify cannot read: exact text match of the candidate is all we have.
            return float(cand is not None and cand.strip() == answer.strip())
        if not pred:
            return 0.0
        return float(mv.verify(gold, pred, timeout_seconds=None))

    def __eq__(self, other):
        return type(other) is type(self) and other.fallback == self.fallback

    def __hash__(self):
        return hash((type(self), self.fallback))
