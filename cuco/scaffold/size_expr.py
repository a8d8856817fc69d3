"""C sizes written in workload.toml's expression language (integers, names, + - * / //), and that language's
expressions taken apart into dimensions.

Two readers write a program's sizes this way: the scaffold's translator, which follows a name through the
definitions of a host-driven program, and the standalone conversion, which follows main()'s locals. They differ in
what a name stands for and in which other nodes they see through; literals, the operators the two languages share
and a shift by a constant are written the same for both, here, as are a parameter's name and an expression's tidy
form.
"""

from __future__ import annotations

import ast
import keyword
import re

from cuco.fastpath.syntax import text

BINARY = frozenset({"+", "-", "*", "/"})  # the operators workload expressions share with C
MAX_DEPTH = 12  # definitions followed, one through another, before giving up


def param_name(c_name: str) -> str:
    """A C identifier as a workload parameter: a valid name of the expression language."""
    return c_name + "_" if keyword.iskeyword(c_name) or c_name == "world" else c_name


def int_literal(raw: str) -> int | None:
    """A C integer literal's value (`1'024`, `0x10`, `8ul`), or None where it is not an integer."""
    digits = raw.replace("'", "").rstrip("uUlL")
    try:
        return int(digits, 0)
    except ValueError:
        return None


def constant(expr: str) -> int | None:
    """The value of an expression without names (evaluated with the workload's own evaluator), else None."""
    from cuco.workload.expr import ExprError, eval_expr, names_in

    try:
        return eval_expr(expr, {}) if not names_in(expr) else None
    except ExprError:
        return None


def define_value(raw: str) -> int | None:
    """The integer a `#define`'s text stands for (`2048`, `8ul`, `(1 << 20)`), else None."""
    raw = " ".join(raw.split())
    shift = re.fullmatch(r"\(?\s*(\d+)\s*<<\s*(\d+)\s*\)?", raw)
    return (int(shift.group(1)) << int(shift.group(2))) if shift else constant(raw.rstrip("uUlL") or "x")


class SizeWriter:
    """A C expression written in workload.toml's language, or None where it is not one. A subclass says what a name
    stands for and what any other kind of node is; `scope` is where names are looked up, as the subclass keeps it."""

    def expr(self, node, scope=None, depth: int = 0) -> str | None:
        if node is None or depth > MAX_DEPTH:
            return None
        if node.type == "number_literal":
            value = int_literal(text(node))
            return None if value is None else str(value)
        if node.type == "identifier":
            return self.identifier(text(node), scope, depth)
        if node.type == "binary_expression":
            return self.binary(node, scope, depth)
        return self.other(node, scope, depth)

    def identifier(self, c_name: str, scope, depth: int) -> str | None:
        raise NotImplementedError

    def other(self, node, scope, depth: int) -> str | None:
        return None

    def binary(self, node, scope, depth: int) -> str | None:
        op = node.child_by_field_name("operator")
        left = self.expr(node.child_by_field_name("left"), scope, depth)
        right = self.expr(node.child_by_field_name("right"), scope, depth)
        if op is None or left is None or right is None:
            return None
        if text(op) in BINARY:
            return f"({left} {text(op)} {right})"
        shift = constant(right)
        if text(op) == "<<" and shift is not None and 0 <= shift < 63:
            return f"({left} * {2 ** shift})"
        return None


def tidy(expr: str) -> str:
    """The expression with the parentheses it needs and no others."""
    return ast.unparse(ast.parse(expr, mode="eval").body)


def _factors(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return _factors(node.left) + _factors(node.right)
    return [node]


def _is_world(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "world"


def dims(expr: str) -> list[str]:
    """A count as dimensions: the factors of its product, `world * (X / world)` cancelled to X (a size sharded over
    the ranks) but where X is a sum (a size rounded to a multiple); one flat dimension when a factor is a bare
    number (its place among the dimensions would be a guess)."""
    factors = _factors(ast.parse(expr, mode="eval").body)
    while any(_is_world(f) for f in factors):
        i = next((i for i, f in enumerate(factors) if isinstance(f, ast.BinOp) and isinstance(f.op, ast.Div)
                  and _is_world(f.right)), None)
        if i is None:
            break
        if any(isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Add, ast.Sub)) for n in ast.walk(factors[i].left)):
            # `(n + world - 1) / world * world` rounds n up to a multiple: no cancelling, one flat dimension
            return [tidy(" * ".join(f"({ast.unparse(f)})" for f in factors))]
        factors[i] = factors[i].left
        factors.pop(next(j for j, f in enumerate(factors) if _is_world(f)))
    if any(isinstance(f, ast.Constant) for f in factors) and len(factors) > 1:
        return [tidy(" * ".join(f"({ast.unparse(f)})" for f in factors))]
    return [ast.unparse(f) for f in factors]
