"""The `calculator` tool: exact arithmetic on an expression, read with `ast` (nothing is evaluated as code).

Allowed: integer and decimal numbers, + - * / // % **, unary + and -, parentheses. Values are exact
fractions, so 0.1+0.2 is 0.3 and 7/2*2 is 7; a result that is not an integer is shown as a decimal of up to
12 significant digits. Anything else (names, calls, attributes, strings) is refused with an error naming it.
Sizes are bounded so that no expression can stall the rollout: exponents at most 1000 in magnitude and
results at most 10^1000 in magnitude.
"""

from __future__ import annotations

import ast
import operator
from fractions import Fraction

from literl.tools.calls import ToolOutput

MAX_EXPRESSION_CHARS = 1000
MAX_EXPONENT = 1000
MAX_MAGNITUDE = Fraction(10) ** 1000
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
           ast.Pow: "**"}


class CalculatorError(ValueError):
    """An expression the calculator refuses or cannot compute; the message is the model's observation."""


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly and return the result.

    Args:
        expression: numbers with + - * / // % ** and parentheses, e.g. "(3+4)*5/2"
    """
    try:
        return format_number(evaluate(expression))
    except CalculatorError as exc:
        return ToolOutput(f"Error: {exc}", "error")


def evaluate(expression: str) -> Fraction:
    """The exact value of `expression`; raises CalculatorError saying what is not allowed."""
    if not isinstance(expression, str):
        raise CalculatorError(f"the expression must be text (got {type(expression).__name__})")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"the expression is {len(expression)} characters; at most {MAX_EXPRESSION_CHARS}")
    expression = expression.replace("^", "**").replace("×", "*").replace("÷", "/")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"cannot read {expression!r} as arithmetic ({exc.msg})") from None
    return _value(tree.body)


def format_number(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.12g}"


def _value(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _value(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        symbol = _SYMBOL[type(node.op)]
        if symbol in ("/", "//", "%") and right == 0:
            raise CalculatorError(f"division by zero in {ast.unparse(node)!r}")
        if symbol == "**":
            if right.denominator != 1:
                raise CalculatorError(f"only whole-number exponents are supported (got {format_number(right)})")
            if abs(right) > MAX_EXPONENT:
                raise CalculatorError(f"exponent {right} is larger than {MAX_EXPONENT}")
            if left == 0 and right < 0:
                raise CalculatorError("zero cannot be raised to a negative power")
            if abs(left) > 1 and abs(right) * _digits(left) > 1000:
                raise CalculatorError(f"the result of {ast.unparse(node)!r} would exceed 10^1000")
        result = _BINARY[type(node.op)](left, right)
        if abs(result) > MAX_MAGNITUDE:
            raise CalculatorError(f"the result of {ast.unparse(node)!r} exceeds 10^1000")
        return Fraction(result)
    raise CalculatorError(f"{ast.unparse(node)!r} is not arithmetic: only numbers, + - * / // % ** and "
                          "parentheses are allowed")


def _digits(value: Fraction) -> int:
    return max(len(str(abs(value.numerator))), len(str(value.denominator)))
