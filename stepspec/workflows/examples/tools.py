"""Tools for the example workflows."""

from __future__ import annotations

import ast
import operator

from stepspec.workflows.agents.tools import tool

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
        ast.USub: operator.neg, ast.UAdd: operator.pos}


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 100:
            raise ValueError("exponent too large")
        return _OPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    raise ValueError(f"not arithmetic: {ast.unparse(node)}")


@tool(side_effect_free=True, timeout=5)
def calculator(expression: str) -> float:
    """Evaluate an arithmetic expression with numbers, + - * / // % ** and parentheses."""
    text = expression.replace("×", "*").replace("÷", "/").replace("^", "**").replace(",", "").replace("$", "")
    value = _eval(ast.parse(text.strip(), mode="eval").body)
    return round(value, 10)
