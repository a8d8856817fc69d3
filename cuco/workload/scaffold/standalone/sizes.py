"""main()'s size expressions in workload.toml's expression language, followed through the locals they name."""

from __future__ import annotations

from cuco.fastpath.syntax import text
from cuco.workload.scaffold.program import constant, param_name
from cuco.workload.scaffold.standalone.nodes import MAX_DEPTH, call_args, callee, int_literal
from cuco.workload.scaffold.standalone.program import Standalone


class Sizes:
    """C size expressions of main() in workload.toml's language: parameters by name, the world size as `world`."""

    def __init__(self, prog: Standalone) -> None:
        self.prog = prog

    def value(self, node) -> int | None:
        expr = self.expr(node)
        return constant(expr) if expr is not None else None

    def expr(self, node, depth: int = 0) -> str | None:
        if node is None or depth > MAX_DEPTH:
            return None
        kind = node.type
        if kind == "number_literal":
            value = int_literal(text(node))
            return None if value is None else str(value)
        if kind == "identifier":
            return self.name(text(node), depth)
        if kind == "parenthesized_expression":
            inner = [c for c in node.named_children if c.type != "comment"]
            return self.expr(inner[0], depth) if len(inner) == 1 else None
        if kind == "cast_expression":
            return self.expr(node.child_by_field_name("value"), depth)
        if kind == "call_expression" and callee(node) == "static_cast" and len(call_args(node)) == 1:
            return self.expr(call_args(node)[0], depth)
        if kind == "binary_expression":
            return self.binary(node, depth)
        return None

    def name(self, name: str, depth: int) -> str | None:
        loc = self.prog.locals.get(name)
        if loc is None:
            value = self.prog.globals.get(name)
            return None if value is None else str(value)
        if loc.kind == "world":
            return "world"
        if loc.kind == "param":
            return param_name(name)
        if loc.kind == "scalar" and loc.init is not None and not loc.pointers:
            inner = self.expr(loc.init, depth + 1)
            return f"({inner})" if inner is not None else None
        return None

    def binary(self, node, depth: int) -> str | None:
        op = text(node.child_by_field_name("operator"))
        left = self.expr(node.child_by_field_name("left"), depth)
        right = self.expr(node.child_by_field_name("right"), depth)
        if left is None or right is None:
            return None
        if op in ("+", "-", "*", "/"):
            return f"({left} {op} {right})"
        shift = constant(right)
        return f"({left} * {2 ** shift})" if op == "<<" and shift is not None and 0 <= shift < 63 else None
