"""The calculator tool: arithmetic parsed and evaluated here, never by ``eval``.

Grammar (a walk over Python's own expression parser, ``ast.parse(mode="eval")``, which only
builds a tree; nothing is executed): numbers, ``+ - * /``, unary minus and plus, parentheses.
Everything else (names, calls, ``**``, attributes, comparisons) is refused with a message.
Values are exact fractions, so ``1/3*3`` is ``1``; results print as integers when they are
whole, else as decimals rounded to 6 places.

Bounds, so a call is cheap whatever the model writes: at most ``MAX_CHARS`` characters, at
most ``MAX_NODES`` tree nodes, and every number, written or intermediate, below ``MAX_ABS``
in size (a product of many large numbers is refused before it grows; ``1e999``, which Python
reads as infinity, is refused as too large). Parsing deep parentheses can raise
``RecursionError`` inside ``ast``: that too is a refusal, not a crash.
"""

from __future__ import annotations

import ast
import math
from fractions import Fraction

MAX_CHARS = 200
MAX_NODES = 200
MAX_ABS = 10**18

_OPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
}


class CalculatorError(ValueError):
    """An expression the calculator refuses; the message is what the model reads."""


def _bounded(value: Fraction) -> Fraction:
    if abs(value) >= MAX_ABS or value.denominator >= MAX_ABS:
        raise CalculatorError("number too large")
    return value


def _literal(number: int | float) -> Fraction:
    """A written number under the same size cap as results."""
    if isinstance(number, float):
        if not math.isfinite(number):  # a float literal past float's range parses as inf
            raise CalculatorError("number too large")
        return _bounded(Fraction(number).limit_denominator(10**9))
    return _bounded(Fraction(number))


def _value(node) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _literal(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _value(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp):
        a, b = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Div):
            if b == 0:
                raise CalculatorError("division by zero")
            out = a / b
        elif type(node.op) in _OPS:
            out = _OPS[type(node.op)](a, b)
        else:
            raise CalculatorError(f"unsupported operator {type(node.op).__name__}; use + - * / and parentheses")
        return _bounded(out)
    raise CalculatorError(f"unsupported expression ({type(node).__name__}); use numbers, + - * / and parentheses")


def evaluate(expression: str) -> Fraction:
    """The exact value of ``expression``; `CalculatorError` when it is not plain arithmetic."""
    text = expression.strip()
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > MAX_CHARS:
        raise CalculatorError(f"expression longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalculatorError("cannot parse the expression") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise CalculatorError(f"expression has more than {MAX_NODES} parts")
    try:
        return _value(tree.body)
    except RecursionError:
        raise CalculatorError("expression nested too deeply") from None


def format_number(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    text = f"{float(value):.6f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def calculator(expression: str) -> str:
    """The tool's callable: the expression's value as text (raises `CalculatorError`)."""
    return format_number(evaluate(expression))
