"""main()'s size expressions in workload.toml's expression language, followed through the locals they name."""

from __future__ import annotations

from cuco.fastpath.syntax import text
from cuco.scaffold.c_expr import cast_call, strip
from cuco.scaffold.size_expr import SizeWriter, constant
from cuco.scaffold.standalone.program import Standalone


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
            return self.prog.param_label(name)
        if loc.kind == "scalar" and loc.init is not None and not loc.pointers:
            inner = self.expr(loc.init, scope, depth + 1)
            return f"({inner})" if inner is not None else None
        return None

    def other(self, node, scope, depth: int) -> str | None:
        if node.type in ("parenthesized_expression", "cast_expression") or cast_call(node):
            return self.expr(strip(node), scope, depth)
        if node.type == "field_expression":  # a struct's field main() holds (`cfg.tokens`)
            name = "".join(text(node).split())
            return self.identifier(name, scope, depth) if name in self.prog.locals else None
        return None
