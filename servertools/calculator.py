"""The `calculator` server tool: arithmetic on numbers, never `eval` (pure).

An expression is parsed by Python's own parser (`ast`, mode `eval`) and walked: only
numbers, `+ - * / // % **`, unary `+ -` and parentheses are allowed; anything else (a
name, a call, an attribute, a string) is refused. Sizes are bounded so no expression
can take long: its length, an exponent, and every intermediate result's magnitude.

The result is a JSON number, except an integer beyond what every JSON reader holds
exactly (magnitude over 2**53, a double's integers): that one is its exact decimal
digits in a string (`2 ** 64` gives `"18446744073709551616"`), so neither the bus's
encoder (64-bit integers at most) nor a reader parsing it as a double changes a digit.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from schemas.tools import FunctionSpec, ToolSpec

MAX_CHARS = 200
MAX_EXPONENT = 100
MAX_MAGNITUDE = 1e100
EXACT_INTEGER = 2**53
"""The largest integer magnitude given as a JSON number; a larger one is a string."""

SPEC = ToolSpec(
    function=FunctionSpec(
        name="calculator",
        description="Evaluate an arithmetic expression: numbers, + - * / // % ** and "
        "parentheses. Example: (2 + 3) * 4 ** 2",
        parameters={
            "type": "object",
            "properties": {"expression": {"type": "string", "maxLength": MAX_CHARS}},
            "required": ["expression"],
        },
    )
)

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}


class CalculationError(ValueError):
    """The expression is not arithmetic this tool does, or its value is out of bounds."""


def calculate(expression: str) -> int | float:
    """The value of `expression`; `CalculationError` says why there is none."""
    if len(expression) > MAX_CHARS:
        raise CalculationError(f"the expression is longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise CalculationError("not an arithmetic expression") from None
    return _value(tree.body)


def _value(node: ast.AST) -> int | float:
    match node:
        case ast.Constant(value=bool()):
            raise CalculationError("only numbers are allowed")
        case ast.Constant(value=int() | float() as number):
            return _bounded(number)
        case ast.UnaryOp(op=op, operand=operand) if type(op) in _UNARY:
            return _bounded(_UNARY[type(op)](_value(operand)))
        case ast.BinOp(left=left, op=op, right=right) if type(op) in _BINARY:
            return _binary(op, _value(left), _value(right))
    raise CalculationError(
        f"{type(node).__name__} is not allowed: only numbers, + - * / // % ** and parentheses"
    )


def _binary(op: ast.operator, left: int | float, right: int | float) -> int | float:
    if isinstance(op, ast.Pow) and abs(right) > MAX_EXPONENT:
        raise CalculationError(f"an exponent is at most {MAX_EXPONENT}")
    try:
        return _bounded(_BINARY[type(op)](left, right))
    except ZeroDivisionError:
        raise CalculationError("division by zero") from None
    except OverflowError:
        raise CalculationError("the result is too large") from None


def _bounded(value: Any) -> int | float:
    if isinstance(value, complex):
        raise CalculationError("the result is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculationError("the result is not a finite number")
    if abs(value) > MAX_MAGNITUDE:
        raise CalculationError("the result is too large")
    return value


def as_json(value: int | float) -> int | float | str:
    """`value` as the tool's result: an integer over `EXACT_INTEGER` as its digits."""
    if isinstance(value, int) and abs(value) > EXACT_INTEGER:
        return str(value)
    return value


class Calculator:
    """The tool: `{"expression": ...}` in, `{"expression", "result"}` out (`as_json`)."""

    spec = SPEC

    async def __call__(self, arguments: dict[str, Any], _caller: object) -> dict[str, Any]:
        expression = arguments.get("expression")
        if not isinstance(expression, str):
            raise CalculationError("expression: a string is required")
        return {"expression": expression, "result": as_json(calculate(expression))}
