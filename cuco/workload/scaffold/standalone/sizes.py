"""main()'s size expressions in workload.toml's expression language, followed through the locals they name."""

from __future__ import annotations

from cuco.workload.scaffold.size_expr import SizeWriter, constant, param_name
from cuco.workload.scaffold.standalone.nodes import call_args, callee
from cuco.workload.scaffold.standalone.program import Standalone


class Sizes(SizeWriter):
    """C size expressions of main() in workload.toml's language: parameters by name, the world size as `world`."""

    def __init__(self, prog: Standalone) -> None:
        self.prog = prog

    def value(self, node) -> int | None:
        expr = self.expr(node)
        return constant(expr) if expr is not None else None

    def identifier(self, name: str, scope, depth: int) -> str | None:
        loc = self.prog.locals.get(name)
        if loc is None:
            value = self.prog.globals.get(name)
            return None if value is None else str(value)
        if loc.kind == "world":
            return "world"
        if loc.kind == "param":
            return param_name(name)
        if loc.kind == "scalar" and loc.init is not None and not loc.pointers:
            inner = self.expr(loc.init, scope, depth + 1)
            return f"({inner})" if inner is not None else None
        return None

    def other(self, node, scope, depth: int) -> str | None:
        kind = node.type
        if kind == "parenthesized_expression":
            inner = [c for c in node.named_children if c.type != "comment"]
            return self.expr(inner[0], scope, depth) if len(inner) == 1 else None
        if kind == "cast_expression":
            return self.expr(node.child_by_field_name("value"), scope, depth)
        if kind == "call_expression" and callee(node) == "static_cast" and len(call_args(node)) == 1:
            return self.expr(call_args(node)[0], scope, depth)
        return None
