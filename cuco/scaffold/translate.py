"""A host-driven program's size expressions translated into workload.toml's language, each name followed back through
its definitions (locals, the fields of the program's state, globals) to `cuco_param(ctx, "N")` (the workload
parameter is the string, never the C variable), the world size (`ctx->nRanks`) or a constant the program fixes.

A name it cannot follow to one of those is marked unsure: a placeholder the scaffold flags, never a parameter passed
off as the program's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cuco.fastpath.syntax import callee, text
from cuco.scaffold.c_expr import cast_call, literal_arg, only_arg, strip
from cuco.scaffold.declarations import INTEGER_TYPES
from cuco.scaffold.definitions import UNSURE, Definitions
from cuco.scaffold.size_expr import SizeWriter, constant, param_name, tidy

# Identifiers and fields that hold the number of ranks in the programs cuco sees.
WORLD_NAMES = frozenset({"nRanks", "nranks", "n_ranks", "numRanks", "num_ranks", "world", "world_size", "worldSize",
                         "nprocs", "nProcs", "nDev", "ndev"})


@dataclass(frozen=True)
class Dim:
    """A size in workload.toml's expression language, and the named dimensions it uses (the world size aside),
    each with the value the program itself fixes for it, if it fixes one."""

    expr: str
    params: dict[str, int | None] = field(default_factory=dict)
    unsure: frozenset[str] = frozenset()  # names the rules cannot follow to a size the program is given


class Translator(SizeWriter):
    """Expressions of one size, translated in the scope of the function (its name) they are written in; the names
    met are collected in `params`, those that could not be followed in `unsure`."""

    def __init__(self, definitions: Definitions) -> None:
        self.definitions = definitions
        self.params: dict[str, int | None] = {}
        self.unsure: set[str] = set()
        self.seen: list[tuple[str, str]] = []

    def dim(self, expr: str) -> Dim:
        """A translated expression with the names it met."""
        return Dim(tidy(expr), self.params, frozenset(self.unsure))

    def other(self, node, fname: str, depth: int) -> str | None:
        kind = node.type
        if kind == "field_expression":
            return self.field(node, fname, depth)
        if kind == "call_expression":
            return self.call(node, fname, depth)
        if kind in ("parenthesized_expression", "cast_expression") or cast_call(node):
            return self.expr(strip(node), fname, depth)
        return None

    def name(self, c_name: str, value: int | None) -> str:
        name = param_name(c_name)
        if self.params.get(name) is None:
            self.params[name] = value
        return name

    def placeholder(self, c_name: str) -> str:
        self.unsure.add(param_name(c_name))
        return self.name(c_name, None)

    def identifier(self, c_name: str, fname: str, depth: int) -> str:
        if c_name in WORLD_NAMES:
            return "world"
        found = self.definitions.definition(fname, c_name)
        return self.follow(c_name, found, depth)

    def field(self, node, fname: str, depth: int) -> str | None:
        fld = node.child_by_field_name("field")
        if fld is None:
            return None
        if text(fld) in WORLD_NAMES:
            return "world"
        return self.follow(text(fld), self.definitions.field_definition(text(fld)), depth)

    def follow(self, c_name: str, found, depth: int) -> str:
        """A name through its one definition: a size the program fixes stays a named dimension with its value."""
        if found is None or found is UNSURE or found in self.seen:
            return self.placeholder(c_name)
        self.seen.append(found)
        before, unsure_before = dict(self.params), set(self.unsure)
        expr = self.expr(found[1], found[0], depth + 1)
        self.seen.pop()
        if expr is None:
            self.params, self.unsure = before, unsure_before
            return self.placeholder(c_name)
        value = constant(expr)
        if value is not None:
            return self.name(c_name, value)
        return f"({expr})"

    def call(self, node, fname: str, depth: int) -> str | None:
        name = callee(node)
        if name == "cuco_param":
            lit = literal_arg(node)
            return self.name(lit, None) if lit is not None and lit.isidentifier() else None
        fn = node.child_by_field_name("function")
        arg = only_arg(node)
        if fn is not None and arg is not None and (fn.type == "primitive_type" or name in INTEGER_TYPES):
            return self.expr(arg, fname, depth)  # a functional cast: size_t(n)
        return None
