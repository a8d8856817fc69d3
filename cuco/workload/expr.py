"""Integer expressions over shape parameters ("M / world"), evaluated without eval(). `max(a, b, ...)` is the one
function: a bound that holds on every rank takes the largest of what different ranks must do."""

from __future__ import annotations

import ast
import operator

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


class ExprError(ValueError):
    pass


def _is_max(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "max"
            and len(node.args) >= 2 and not node.keywords)


def parse_expr(text: str) -> ast.expr:
    """Parse and check that only integers, names, + - * / //, max(...) and parentheses are used."""
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError as exc:
        raise ExprError(f"cannot parse expression {text!r}") from exc
    for node in ast.walk(tree):
        if isinstance(node, (ast.BinOp, ast.Name, ast.Load, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv)):
            continue
        if (isinstance(node, ast.Constant) and isinstance(node.value, int)) or _is_max(node):
            continue
        raise ExprError(f"expression {text!r} may only use integers, parameter names, + - * / // and max(...)")
    return tree


def names_in(text: str) -> set[str]:
    tree = parse_expr(text)
    functions = {id(n.func) for n in ast.walk(tree) if _is_max(n)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in functions}


def eval_expr(text: str | int, env: dict[str, int]) -> int:
    """Evaluate; '/' must divide exactly (a shape that does not divide by the world size is an error)."""
    if isinstance(text, int):
        return text

    def ev(node: ast.expr) -> int:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in env:
                raise ExprError(f"unknown name {node.id!r} in {text!r} (known: {', '.join(sorted(env))})")
            return env[node.id]
        if isinstance(node, ast.Call):
            return max(ev(a) for a in node.args)
        assert isinstance(node, ast.BinOp)
        left, right = ev(node.left), ev(node.right)
        if isinstance(node.op, ast.Div):
            if right == 0 or left % right:
                raise ExprError(f"{ast.unparse(node)} = {left} / {right} does not divide exactly")
            return left // right
        return _OPS[type(node.op)](left, right)

    return ev(parse_expr(text))
