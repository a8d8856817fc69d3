"""A host-driven program read for its sizes: which dimension each count, allocation and GEMM argument stands for.

The fast path's analysis says which buffers each call touches; a workload also needs their shapes, written as
expressions over named dimensions (workload.toml's language: integers, names, + - * / //). This module follows a
call's size arguments back through the function's declarations to `cuco_param(ctx, "N")`, the world size
(`ctx->nRanks`) or a constant the program fixes, on the same syntax tree the analysis uses.
"""

from __future__ import annotations

import ast
import keyword
from dataclasses import dataclass, field
from pathlib import Path

from cuco.dtypes import DTYPES
from cuco.fastpath.syntax import blank_macros, function_name, parser, text, walk

# Identifiers and fields that hold the number of ranks in the programs cuco sees.
WORLD_NAMES = frozenset({"nRanks", "nranks", "n_ranks", "numRanks", "num_ranks", "world", "world_size", "worldSize",
                         "nprocs", "nProcs", "nDev", "ndev"})
# C types of sizeof(...) and the workload dtype they hold.
C_TYPES = {**{d.c_type: d.name for d in DTYPES.values()}, "nv_bfloat16": "bf16", "bfloat16": "bf16", "half": "f16",
           "int": "i32", "long long": "i64", "char": "i8", "signed char": "i8", "unsigned char": "u8"}
BINARY = frozenset({"+", "-", "*", "/"})  # the operators workload expressions share with C
MAX_DEPTH = 12  # declarations followed, one through another, before giving up


@dataclass(frozen=True)
class Dim:
    """A size in workload.toml's expression language, and the named dimensions it uses (the world size aside),
    each with the value the program itself fixes for it, if it fixes one."""

    expr: str
    params: dict[str, int | None] = field(default_factory=dict)
    unsure: frozenset[str] = frozenset()  # names the program computes at run time: not sizes it is given


def param_name(c_name: str) -> str:
    """A C identifier as a workload parameter: a valid name of the expression language."""
    return c_name + "_" if keyword.iskeyword(c_name) or c_name == "world" else c_name


def _int_literal(raw: str) -> int | None:
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


class _Translator:
    """One expression of one function, translated; the names it met are collected in `params`."""

    def __init__(self, decls: dict[str, object]) -> None:
        self.decls = decls
        self.params: dict[str, int | None] = {}
        self.unsure: set[str] = set()
        self.seen: list[str] = []

    def run(self, node, depth: int = 0) -> str | None:
        if node is None or depth > MAX_DEPTH:
            return None
        kind = node.type
        if kind == "number_literal":
            value = _int_literal(text(node))
            return None if value is None else str(value)
        if kind == "identifier":
            return self.identifier(text(node), depth)
        if kind == "field_expression":
            fld = node.child_by_field_name("field")
            return "world" if fld is not None and text(fld) in WORLD_NAMES else self.name(text(fld or node), None)
        if kind == "call_expression":
            return self.call(node, depth)
        if kind == "parenthesized_expression":
            inner = [c for c in node.named_children if c.type != "comment"]
            return self.run(inner[0], depth) if len(inner) == 1 else None
        if kind == "cast_expression":
            return self.run(node.child_by_field_name("value"), depth)
        if kind == "binary_expression":
            return self.binary(node, depth)
        return None

    def name(self, c_name: str, value: int | None) -> str:
        name = param_name(c_name)
        if self.params.get(name) is None:
            self.params[name] = value
        return name

    def identifier(self, c_name: str, depth: int) -> str:
        if c_name in WORLD_NAMES:
            return "world"
        init = self.decls.get(c_name)
        if init is None or c_name in self.seen:
            return self.name(c_name, None)
        self.seen.append(c_name)
        before = dict(self.params)
        expr = self.run(init, depth + 1)
        self.seen.pop()
        if expr is None:
            self.params = before
            self.unsure.add(param_name(c_name))
            return self.name(c_name, None)
        value = constant(expr)
        if value is not None:  # a size the program fixes: a named dimension, with the program's value
            return self.name(c_name, value)
        return f"({expr})"

    def call(self, node, depth: int) -> str | None:
        fn = node.child_by_field_name("function")
        args = node.child_by_field_name("arguments")
        if fn is None or args is None:
            return None
        named = [a for a in args.named_children if a.type != "comment"]
        if text(fn) == "cuco_param":
            lit = next((n for n in walk(node) if n.type == "string_content"), None)
            return self.name(text(lit), None) if lit is not None else None
        if fn.type == "template_function" and text(fn).startswith("static_cast") and len(named) == 1:
            return self.run(named[0], depth)
        return None

    def binary(self, node, depth: int) -> str | None:
        op = node.child_by_field_name("operator")
        left = self.run(node.child_by_field_name("left"), depth)
        right = self.run(node.child_by_field_name("right"), depth)
        if op is None or left is None or right is None:
            return None
        if text(op) in BINARY:
            return f"({left} {text(op)} {right})"
        shift = constant(right)
        if text(op) == "<<" and shift is not None and 0 <= shift < 63:
            return f"({left} * {2 ** shift})"
        return None


LOOPS = ("for_statement", "while_statement", "do_statement", "for_range_loop")


def _in_loop(node, fn) -> bool:
    parent = node.parent
    while parent is not None and parent != fn:
        if parent.type in LOOPS:
            return True
        parent = parent.parent
    return False


@dataclass
class Call:
    """One call of the program: where it is and its argument nodes."""

    name: str
    line: int
    function: str
    args: list
    in_loop: bool  # inside a for, while or do loop: it runs once per iteration


class Program:
    """The program's syntax tree, its calls by line and name, and each function's declarations."""

    def __init__(self, path: Path, raw: bytes) -> None:
        self.path = path
        self.root = parser().parse(blank_macros(raw)).root_node
        self.decls: dict[str, dict[str, object]] = {}
        self.calls: dict[tuple[int, str], Call] = {}
        for fn in (n for n in walk(self.root) if n.type == "function_definition"):
            self._read_function(fn)

    def _read_function(self, fn) -> None:
        fname = function_name(fn)
        decls = self.decls.setdefault(fname, {})
        for node in walk(fn):
            if node.type == "init_declarator":
                target, value = node.child_by_field_name("declarator"), node.child_by_field_name("value")
                ident = next((n for n in walk(target) if n.type == "identifier"), None) if target else None
                if ident is not None and value is not None:
                    decls.setdefault(text(ident), value)
            elif node.type == "call_expression":
                callee, args = node.child_by_field_name("function"), node.child_by_field_name("arguments")
                if callee is not None and args is not None:
                    line = node.start_point.row + 1
                    self.calls.setdefault((line, text(callee)), Call(
                        text(callee), line, fname, [a for a in args.named_children if a.type != "comment"],
                        _in_loop(node, fn)))

    def syntax_error(self) -> tuple[int, str] | None:
        """The first place the grammar did not understand: its line and a short excerpt."""
        bad = next((n for n in walk(self.root) if n.type == "ERROR" or n.is_missing), None)
        if bad is None:
            return None
        excerpt = " ".join(text(bad).split())[:40] or f"a missing {bad.type}"
        return bad.start_point.row + 1, excerpt

    def call(self, line: int, name: str) -> Call | None:
        return self.calls.get((line, name))

    def dim(self, call: Call, position: int) -> Dim | None:
        """The size argument at `position` of a call, as a workload expression, or None where it is not one."""
        if position >= len(call.args):
            return None
        tr = _Translator(self.decls.get(call.function, {}))
        expr = tr.run(call.args[position])
        return Dim(tidy(expr), tr.params, frozenset(tr.unsure)) if expr is not None else None

    def is_piece(self, call: Call, position: int) -> bool:
        """The pointer argument at `position` points into a buffer (`a + off`, `&a[i]`): the call's sizes are a
        piece's, not the buffer's."""
        if position >= len(call.args):
            return False
        node = call.args[position]
        while node.type in ("cast_expression", "parenthesized_expression"):
            inner = node.child_by_field_name("value") if node.type == "cast_expression" else next(
                (c for c in node.named_children if c.type != "comment"), None)
            if inner is None:
                break
            node = inner
        return node.type in ("binary_expression", "pointer_expression", "subscript_expression")

    def alloc_count(self, call: Call) -> tuple[Dim | None, str | None]:
        """An allocation's bytes as elements and their dtype: `n * sizeof(float)` is n elements of f32."""
        if len(call.args) < 2:
            return None, None
        factors, stack = [], [call.args[1]]
        while stack:  # the top-level product's factors
            n = stack.pop()
            op = n.child_by_field_name("operator") if n.type == "binary_expression" else None
            if op is not None and text(op) == "*":
                stack += [n.child_by_field_name("right"), n.child_by_field_name("left")]
            else:
                factors.append(n)
        sizes = [f for f in factors if f.type == "sizeof_expression"]
        if len(sizes) != 1:
            return None, None
        ctype = " ".join(text(sizes[0]).removeprefix("sizeof").strip().strip("()").split())
        tr = _Translator(self.decls.get(call.function, {}))
        parts = [tr.run(f) for f in factors if f is not sizes[0]] or ["1"]
        if any(p is None for p in parts):
            return None, C_TYPES.get(ctype)
        return Dim(tidy(" * ".join(parts)), tr.params, frozenset(tr.unsure)), C_TYPES.get(ctype)


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
    """A count as dimensions: the factors of its product, `world * (X / world)` cancelled to X; one flat dimension
    when a factor is a bare number (its place among the dimensions would be a guess)."""
    factors = _factors(ast.parse(expr, mode="eval").body)
    while any(_is_world(f) for f in factors):
        i = next((i for i, f in enumerate(factors) if isinstance(f, ast.BinOp) and isinstance(f.op, ast.Div)
                  and _is_world(f.right)), None)
        if i is None:
            break
        factors[i] = factors[i].left
        factors.pop(next(j for j, f in enumerate(factors) if _is_world(f)))
    if any(isinstance(f, ast.Constant) for f in factors) and len(factors) > 1:
        return [tidy(" * ".join(f"({ast.unparse(f)})" for f in factors))]
    return [ast.unparse(f) for f in factors]
