"""A host-driven program read for its sizes and buffers: which dimension each count, allocation and GEMM argument
stands for, which buffer each pointer is, its element type, and what each kernel does with the pointers it gets.

The fast path's analysis says which buffers each call touches; a workload also needs their shapes, written as
expressions over named dimensions (workload.toml's language: integers, names, + - * / //). This module follows a
call's size arguments back through the program's definitions (locals, the fields of its state, globals) to
`cuco_param(ctx, "N")` (the workload parameter is the string, never the C variable), the world size
(`ctx->nRanks`) or a constant the program fixes, on the same syntax tree the analysis uses. A name it cannot follow
to one of those is marked unsure: a placeholder the scaffold flags, never a parameter passed off as the program's.
"""

from __future__ import annotations

import ast
import keyword
from dataclasses import dataclass, field
from pathlib import Path

from cuco.dtypes import DTYPES
from cuco.fastpath.analyze import ALLOCATORS
from cuco.fastpath.syntax import blank_macros, function_name, parser, text, walk

# Identifiers and fields that hold the number of ranks in the programs cuco sees.
WORLD_NAMES = frozenset({"nRanks", "nranks", "n_ranks", "numRanks", "num_ranks", "world", "world_size", "worldSize",
                         "nprocs", "nProcs", "nDev", "ndev"})
# C element types and the workload dtype they hold (sizeof(...) and pointer types).
C_TYPES = {**{d.c_type: d.name for d in DTYPES.values()}, "nv_bfloat16": "bf16", "bfloat16": "bf16", "half": "f16",
           "int": "i32", "long long": "i64", "char": "i8", "signed char": "i8", "unsigned char": "u8"}
BYTE_VIEWS = frozenset({"char", "signed char", "unsigned char", "void"})  # a pointer cast for byte arithmetic
BINARY = frozenset({"+", "-", "*", "/"})  # the operators workload expressions share with C
CASTS = ("static_cast", "reinterpret_cast", "const_cast")
INTEGER_TYPES = frozenset({"size_t", "int", "long", "unsigned", "int64_t", "int32_t", "uint64_t", "uint32_t",
                           "ptrdiff_t", "ssize_t", "long long", "unsigned long", "unsigned long long", "long int"})
READ_INTRINSICS = ("__ldg", "__ldca", "__ldcg", "__ldcs", "__ldlu", "__ldcv")
WRITE_INTRINSICS = ("__stwb", "__stcg", "__stcs", "__stwt")
MAX_DEPTH = 12  # definitions followed, one through another, before giving up
LOOPS = ("for_statement", "while_statement", "do_statement", "for_range_loop")
UNSURE = object()  # a name defined more than once, or changed after its definition


@dataclass(frozen=True)
class Dim:
    """A size in workload.toml's expression language, and the named dimensions it uses (the world size aside),
    each with the value the program itself fixes for it, if it fixes one."""

    expr: str
    params: dict[str, int | None] = field(default_factory=dict)
    unsure: frozenset[str] = frozenset()  # names the rules cannot follow to a size the program is given


@dataclass(frozen=True)
class Ref:
    """A pointer into a buffer: the whole of it (its start), or a piece (`x + offset`, a pointer moved later)."""

    buffer: str
    whole: bool = True


@dataclass(frozen=True)
class Access:
    reads: bool
    writes: bool
    sure: bool = True  # False: the pointer goes where the rules do not follow; both are assumed


@dataclass(frozen=True)
class KernelParam:
    name: str
    pointer: bool
    const: bool  # points to const: read only
    ctype: str | None  # the element type a pointer parameter points to


@dataclass
class Call:
    """One call of the program: where it is and its argument nodes."""

    name: str
    line: int
    function: str
    args: list
    in_loop: bool  # inside a for, while or do loop: it runs once per iteration
    node: object = None


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


def literal_arg(call_node) -> str | None:
    """The string literal a call names (`cuco_buffer(ctx, "x")` -> x)."""
    lit = next((n for n in walk(call_node) if n.type == "string_content"), None)
    return text(lit) if lit is not None else None


def callee(node) -> str:
    fn = node.child_by_field_name("function") if node.type == "call_expression" else None
    return text(fn) if fn is not None else ""


def _cast_call(node) -> bool:
    """`static_cast<T>(x)` and its kin."""
    fn = node.child_by_field_name("function") if node is not None and node.type == "call_expression" else None
    return fn is not None and fn.type == "template_function" and text(fn).startswith(CASTS)


def _only_arg(node):
    args = node.child_by_field_name("arguments")
    named = [a for a in args.named_children if a.type != "comment"] if args is not None else []
    return named[0] if len(named) == 1 else None


def strip(node):
    """Parentheses and casts around an expression: `(T*)(x->ptr)` and `static_cast<T*>(x->ptr)` are x->ptr."""
    while node is not None:
        if node.type == "parenthesized_expression":
            inner = [c for c in node.named_children if c.type != "comment"]
            node = inner[0] if len(inner) == 1 else None
        elif node.type == "cast_expression":
            node = node.child_by_field_name("value")
        elif _cast_call(node):
            node = _only_arg(node)
        else:
            return node
    return None


def element_type(type_node, declarator) -> str | None:
    """The element type of a one-level pointer type (`const __nv_bfloat16*`), without qualifiers."""
    if type_node is None or declarator is None:
        return None
    stars = sum(1 for n in walk(declarator) if n.type == "*")
    if stars != 1 or type_node.type == "placeholder_type_specifier":
        return None
    return " ".join(text(type_node).split())


def dtype_of(ctype: str | None) -> str | None:
    """The workload dtype a pointer's element type holds; None for byte views, vectors and unknown types."""
    return None if ctype is None or ctype in BYTE_VIEWS else C_TYPES.get(ctype)


def _cast_desc(node):
    """The type a cast converts to: `(T*)x`, `static_cast<T*>(x)`."""
    if node is None:
        return None
    if node.type == "cast_expression":
        return node.child_by_field_name("type")
    if _cast_call(node):
        targs = node.child_by_field_name("function").child_by_field_name("arguments")
        return next((c for c in targs.named_children if c.type == "type_descriptor"), None) if targs else None
    return None


def _cast_type(node) -> str | None:
    """The element type a pointer cast converts to."""
    desc = _cast_desc(node)
    return element_type(desc.child_by_field_name("type"), desc.child_by_field_name("declarator")) if desc else None


def _in_loop(node, fn) -> bool:
    parent = node.parent
    while parent is not None and parent != fn:
        if parent.type in LOOPS:
            return True
        parent = parent.parent
    return False


def _declared_name(declarator) -> str | None:
    ident = next((n for n in walk(declarator) if n.type == "identifier"), None) if declarator is not None else None
    return text(ident) if ident is not None else None


def _value(decl_value):
    """An initializer's expression: `n{x}` and `n = {x}` are x."""
    if decl_value is not None and decl_value.type == "initializer_list":
        inner = [c for c in decl_value.named_children if c.type != "comment"]
        return inner[0] if len(inner) == 1 else None
    return decl_value


class _Translator:
    """One expression, translated; the names it met are collected in `params`, those it could not follow in
    `unsure`."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.params: dict[str, int | None] = {}
        self.unsure: set[str] = set()
        self.seen: list[tuple[str, str]] = []

    def run(self, node, fname: str, depth: int = 0) -> str | None:
        if node is None or depth > MAX_DEPTH:
            return None
        kind = node.type
        if kind == "number_literal":
            value = _int_literal(text(node))
            return None if value is None else str(value)
        if kind == "identifier":
            return self.identifier(text(node), fname, depth)
        if kind == "field_expression":
            return self.field(node, fname, depth)
        if kind == "call_expression":
            return self.call(node, fname, depth)
        if kind in ("parenthesized_expression", "cast_expression") or _cast_call(node):
            return self.run(strip(node), fname, depth)
        if kind == "binary_expression":
            return self.binary(node, fname, depth)
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
        found = self.program.definition(fname, c_name)
        return self.follow(c_name, found, depth)

    def field(self, node, fname: str, depth: int) -> str | None:
        fld = node.child_by_field_name("field")
        if fld is None:
            return None
        if text(fld) in WORLD_NAMES:
            return "world"
        return self.follow(text(fld), self.program.field_definition(text(fld)), depth)

    def follow(self, c_name: str, found, depth: int) -> str:
        """A name through its one definition: a size the program fixes stays a named dimension with its value."""
        if found is None or found is UNSURE or found in self.seen:
            return self.placeholder(c_name)
        self.seen.append(found)
        before, unsure_before = dict(self.params), set(self.unsure)
        expr = self.run(found[1], found[0], depth + 1)
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
        arg = _only_arg(node)
        if fn is not None and arg is not None and (fn.type == "primitive_type" or name in INTEGER_TYPES):
            return self.run(arg, fname, depth)  # a functional cast: size_t(n)
        return None

    def binary(self, node, fname: str, depth: int) -> str | None:
        op = node.child_by_field_name("operator")
        left = self.run(node.child_by_field_name("left"), fname, depth)
        right = self.run(node.child_by_field_name("right"), fname, depth)
        if op is None or left is None or right is None:
            return None
        if text(op) in BINARY:
            return f"({left} {text(op)} {right})"
        shift = constant(right)
        if text(op) == "<<" and shift is not None and 0 <= shift < 63:
            return f"({left} * {2 ** shift})"
        return None


class Program:
    """The program's syntax tree: its calls by line and name, every name's definitions, the buffers it names and
    the pointers into them, and its kernels."""

    def __init__(self, path: Path, raw: bytes) -> None:
        self.path = path
        self.root = parser().parse(blank_macros(raw)).root_node
        self.functions: dict[str, object] = {}
        self.defs: dict[str, dict[str, list]] = {}  # function -> name -> values it is given (declared or assigned)
        self.changed: dict[str, set[str]] = {}  # function -> names updated in place (+=, ++, &name)
        self.declared: dict[str, set[str]] = {}
        self.fields: dict[str, list[tuple[str, object]]] = {}  # field -> (function, value) of each `x->f = v`
        self.changed_fields: set[str] = set()
        self.calls: dict[tuple[int, str], Call] = {}
        self.handed: dict[str, list[int]] = {}  # cuco_buffer(ctx, "x"): x -> lines
        self.read_params: dict[str, list[int]] = {}  # cuco_param(ctx, "N"): N -> lines
        self.allocated: set[str] = set()  # what the program allocates itself (`d_x`, `s->buf`)
        self.handles: dict[str, dict[str, str]] = {}  # function -> variable holding cuco_buffer(ctx, "x") -> x
        self.aliases: dict[str, dict[str, Ref]] = {}  # function -> pointer variable -> where it points
        self.casts: dict[str, list[tuple[str, int]]] = {}  # buffer -> element types it is used as, with lines
        self.kernels: dict[str, list[KernelParam]] = {}
        self.field_refs: dict[str, tuple[str, object]] = {}  # field -> ("handle", buffer) or ("ref", Ref | None)
        self.passed: dict[str, set[str]] = {}  # host function -> its pointer parameters: buffers its caller passes
        self.device_functions: set[str] = set()  # __device__ functions: called from kernels, not from the host
        self._globals()
        fns = [n for n in walk(self.root) if n.type == "function_definition"]
        for fn in fns:
            self._read_function(fn)
        for _ in range(2):  # twice: a field set in a function defined after the one that uses it
            for fn in fns:
                self._read_pointers(fn)
        for fn in fns:
            self._read_casts(fn)

    # ---- definitions ------------------------------------------------------------------------------
    def _globals(self) -> None:
        """File-scope definitions (`constexpr int kVec = 8;`) under the function name ""."""
        for decl in (n for n in self.root.named_children if n.type == "declaration"):
            self._declare(decl, "")

    def _declare(self, decl, fname: str) -> None:
        for d in decl.named_children:
            target = d.child_by_field_name("declarator") if d.type == "init_declarator" else d
            name = _declared_name(target) if d.type in ("init_declarator", "identifier", "pointer_declarator") \
                else None
            if name is None:
                continue
            self.declared.setdefault(fname, set()).add(name)
            value = _value(d.child_by_field_name("value")) if d.type == "init_declarator" else None
            if value is not None:
                self.defs.setdefault(fname, {}).setdefault(name, []).append(value)

    def _assign(self, node, fname: str) -> None:
        left, op = node.child_by_field_name("left"), node.child_by_field_name("operator")
        right = node.child_by_field_name("right")
        if left is None or op is None:
            return
        if left.type == "identifier":
            if text(op) == "=" and right is not None:
                self.defs.setdefault(fname, {}).setdefault(text(left), []).append(right)
            else:
                self.changed.setdefault(fname, set()).add(text(left))
        elif left.type == "field_expression" and left.child_by_field_name("field") is not None:
            fld = text(left.child_by_field_name("field"))
            if text(op) == "=" and right is not None:
                self.fields.setdefault(fld, []).append((fname, right))
            else:
                self.changed_fields.add(fld)

    def _update(self, node, fname: str) -> None:
        """`n++`, `s->n += k`, `&n` (written through its address): no single definition any more."""
        target = node.child_by_field_name("argument")
        if target is None:
            return
        if target.type == "identifier":
            self.changed.setdefault(fname, set()).add(text(target))
        elif target.type == "field_expression" and target.child_by_field_name("field") is not None:
            self.changed_fields.add(text(target.child_by_field_name("field")))

    def _read_function(self, fn) -> None:
        fname = function_name(fn)
        self.functions.setdefault(fname, fn)
        params = _params(fn)
        self.declared.setdefault(fname, set()).update(p.name for p in params)
        qualifiers = {c.type for c in fn.children}
        if "__global__" in qualifiers:
            self.kernels[fname] = params
        elif "__device__" in qualifiers and "__host__" not in qualifiers:
            self.device_functions.add(fname)
        else:
            self.passed[fname] = {p.name for p in params if p.pointer and (dtype_of(p.ctype) or p.ctype in BYTE_VIEWS)}
        for node in walk(fn):
            if node.type == "declaration":
                self._declare(node, fname)
            elif node.type == "assignment_expression":
                self._assign(node, fname)
            elif node.type == "update_expression" or (node.type == "pointer_expression" and text(node)[:1] == "&"):
                self._update(node, fname)
            elif node.type == "call_expression":
                self._read_call(node, fn, fname)

    def _read_call(self, node, fn, fname: str) -> None:
        name, args, fn_node = callee(node), node.child_by_field_name("arguments"), node.child_by_field_name("function")
        if args is None or not name or _cast_call(node) or fn_node.type == "primitive_type" or name in INTEGER_TYPES:
            return  # a cast, not a call
        line = node.start_point.row + 1
        named = [a for a in args.named_children if a.type != "comment"]
        self.calls.setdefault((line, name), Call(name, line, fname, named, _in_loop(node, fn), node))
        lit = literal_arg(node) if name in ("cuco_buffer", "cuco_param") else None
        if lit is not None:
            (self.handed if name == "cuco_buffer" else self.read_params).setdefault(lit, []).append(line)
        if name in ALLOCATORS and named:
            target = next((n for n in walk(named[0]) if n.type in ("field_expression", "identifier")), None)
            if target is not None:
                self.allocated.add(text(target).replace(" ", ""))

    def definition(self, fname: str, name: str):
        """(function, value) of the one definition of a name used in fname, UNSURE, or None if it has none: a
        local's in fname, else a global's, wherever a function assigns it without declaring its own."""
        if name in self.declared.get(fname, set()) or name in self.defs.get(fname, {}):
            if name in self.changed.get(fname, set()):
                return UNSURE
            return self._pick([(fname, v) for v in self.defs.get(fname, {}).get(name, [])])
        shared = [f for f in self.defs.keys() | self.changed.keys() if f == "" or name not in self.declared.get(f, ())]
        if any(name in self.changed.get(f, set()) for f in shared):
            return UNSURE
        return self._pick([(f, v) for f in shared for v in self.defs.get(f, {}).get(name, [])])

    def field_definition(self, fld: str):
        """(function, value) of the one assignment of a field of the program's state (`s->n = ...`)."""
        if fld in self.changed_fields:
            return UNSURE
        return self._pick(self.fields.get(fld, []))

    @staticmethod
    def _pick(found: list):
        if not found:
            return None
        if len({" ".join(text(v).split()) for _, v in found}) > 1:
            return UNSURE
        return found[0]

    # ---- pointers -----------------------------------------------------------------------------------
    def _read_pointers(self, fn) -> None:
        """Where the function's local pointers point, in the order they are defined (one assigned again points
        somewhere inside its buffer), and the pointers and handles it keeps in the fields of its state."""
        fname = function_name(fn)
        handles, aliases = self.handles.setdefault(fname, {}), {}
        for node in walk(fn):
            if node.type == "init_declarator":
                name, value = _declared_name(node.child_by_field_name("declarator")), node.child_by_field_name("value")
                self._bind(fname, name, value, handles, aliases)
            elif node.type == "assignment_expression" and text(node.child_by_field_name("operator") or node) == "=":
                left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
                if left is not None and left.type == "identifier" and text(left) in aliases:
                    aliases[text(left)] = Ref(aliases[text(left)].buffer, False)
                elif left is not None and left.type == "identifier":
                    self._bind(fname, text(left), right, handles, aliases)
                elif left is not None and left.type == "field_expression":
                    self._bind_field(fname, text(left.child_by_field_name("field") or left), right, aliases)
        self.aliases[fname] = aliases

    def _bind(self, fname: str, name: str | None, value, handles: dict[str, str], aliases: dict[str, Ref]) -> None:
        inner = strip(value) if value is not None else None
        if name is None or inner is None:
            return
        if callee(inner) == "cuco_buffer" and literal_arg(inner) is not None:
            handles[name] = literal_arg(inner)
        elif (r := self.ref(fname, value, aliases)) is not None:
            aliases[name] = r

    def _bind_field(self, fname: str, fld: str, value, aliases: dict[str, Ref]) -> None:
        """`s->x = cuco_buffer(ctx, "x")` or `s->x = (T*)...->ptr` in one function, `s->x` used in another; a field
        given two different buffers is no buffer."""
        inner = strip(value) if value is not None else None
        if inner is None:
            return
        found = ("handle", literal_arg(inner)) if callee(inner) == "cuco_buffer" else \
            ("ref", self.ref(fname, value, aliases))
        if found[1] is None:
            return
        if self.field_refs.get(fld, found) != found:
            found = ("ref", None)
        self.field_refs[fld] = found

    def _read_casts(self, fn) -> None:
        """The element types the program uses each workload buffer's pointer as."""
        handles = self.handles.get(function_name(fn), {})
        for node in walk(fn):
            buf = self._ptr_of(node, handles)
            if buf is not None:
                self._learn_cast(buf, node)

    def _ptr_of(self, node, handles: dict[str, str]) -> str | None:
        """The buffer of a `cuco_buffer(ctx, "x")->ptr` or `handle->ptr` expression."""
        if node.type != "field_expression" or text(node.child_by_field_name("field") or node) != "ptr":
            return None
        arg = strip(node.child_by_field_name("argument"))
        if arg is not None and callee(arg) == "cuco_buffer":
            return literal_arg(arg)
        if arg is not None and arg.type == "field_expression":
            kind, value = self.field_refs.get(text(arg.child_by_field_name("field") or arg), (None, None))
            return value if kind == "handle" else None
        return handles.get(text(arg)) if arg is not None and arg.type == "identifier" else None

    def _learn_cast(self, buf: str, node) -> None:
        """The element type the program gives `x->ptr`: the outermost cast around it, else the declared type of
        the pointer it initialises."""
        found, parent = None, node.parent
        while parent is not None:
            if parent.type == "cast_expression" or _cast_call(parent):
                found = _cast_type(parent) or found
            elif parent.type == "argument_list" and parent.parent is not None and _cast_call(parent.parent):
                pass
            elif parent.type != "parenthesized_expression":
                break
            node, parent = parent, parent.parent
        if found is None and parent is not None and parent.type == "init_declarator":
            decl = parent.parent
            found = element_type(decl.child_by_field_name("type"), parent.child_by_field_name("declarator"))
        if found is not None:
            self.casts.setdefault(buf, []).append((found, node.start_point.row + 1))

    def ref(self, fname: str, node, aliases: dict[str, Ref] | None = None) -> Ref | None:
        """The buffer a pointer expression points into, and whether at its start."""
        node = strip(node)
        aliases = self.aliases.get(fname, {}) if aliases is None else aliases
        if node is None:
            return None
        if node.type == "field_expression":
            return self._field_ref(fname, node)
        if node.type == "identifier":
            name = text(node)
            known = name in self.allocated or name in self.passed.get(fname, ())
            return aliases.get(name) or (Ref(name) if known else None)
        if node.type == "binary_expression" and text(node.child_by_field_name("operator")) in ("+", "-"):
            r = self.ref(fname, node.child_by_field_name("left"), aliases)
            if r is None and text(node.child_by_field_name("operator")) == "+":
                r = self.ref(fname, node.child_by_field_name("right"), aliases)
            return Ref(r.buffer, False) if r is not None else None
        if node.type == "pointer_expression" and text(node)[:1] == "&":
            inner = strip(node.child_by_field_name("argument"))
            if inner is not None and inner.type == "subscript_expression":
                r = self.ref(fname, inner.child_by_field_name("argument"), aliases)
                at_start = _int_literal(text(inner.child_by_field_name("indices") or inner).strip("[] ")) == 0
                return Ref(r.buffer, at_start and r.whole) if r is not None else None
        return None

    def _field_ref(self, fname: str, node) -> Ref | None:
        """`x->ptr` of a handle, a buffer the program allocated into a field (`s->buf`), or a pointer it keeps in
        one (`s->x = (T*)cuco_buffer(ctx, "x")->ptr` in setup)."""
        buf = self._ptr_of(node, self.handles.get(fname, {}))
        if buf is not None:
            return Ref(buf)
        key = text(node).replace(" ", "")
        if key in self.allocated:
            return Ref(key)
        kind, value = self.field_refs.get(text(node.child_by_field_name("field") or node), (None, None))
        return value if kind == "ref" else None

    # ---- calls --------------------------------------------------------------------------------------
    def call(self, line: int, name: str) -> Call | None:
        return self.calls.get((line, name))

    def syntax_error(self) -> tuple[int, str] | None:
        """The first place the grammar did not understand: its line and a short excerpt."""
        bad = next((n for n in walk(self.root) if n.type == "ERROR" or n.is_missing), None)
        if bad is None:
            return None
        excerpt = " ".join(text(bad).split())[:40] or f"a missing {bad.type}"
        return bad.start_point.row + 1, excerpt

    def translate(self, node, fname: str) -> Dim | None:
        """An expression of function fname as a workload expression, or None where it is not one."""
        tr = _Translator(self)
        expr = tr.run(node, fname)
        return Dim(tidy(expr), tr.params, frozenset(tr.unsure)) if expr is not None else None

    def dim(self, call: Call, position: int) -> Dim | None:
        """The size argument at `position` of a call, as a workload expression, or None where it is not one."""
        return self.translate(call.args[position], call.function) if position < len(call.args) else None

    def arg_ref(self, call: Call, position: int) -> Ref | None:
        return self.ref(call.function, call.args[position]) if position < len(call.args) else None

    def is_piece(self, call: Call, position: int) -> bool:
        """The pointer argument at `position` is not a buffer's start, or the rules cannot tell: the call's sizes
        are a piece's, not the buffer's."""
        r = self.arg_ref(call, position)
        return r is None or not r.whole

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
        tr = _Translator(self)
        parts = [tr.run(f, call.function) for f in factors if f is not sizes[0]] or ["1"]
        if any(p is None for p in parts):
            return None, C_TYPES.get(ctype)
        return Dim(tidy(" * ".join(parts)), tr.params, frozenset(tr.unsure)), C_TYPES.get(ctype)

    def call_site_const(self, call: Call, position: int) -> bool:
        """The argument is cast to a pointer to const where it is passed: the callee only reads through it."""
        node = call.args[position] if position < len(call.args) else None
        while node is not None and node.type in ("parenthesized_expression", "cast_expression") or _cast_call(node):
            desc = _cast_desc(node)
            if desc is not None and any(c.type == "type_qualifier" and text(c) == "const" for c in desc.children):
                return True
            node = node.child_by_field_name("value") if node.type == "cast_expression" else \
                _only_arg(node) if _cast_call(node) else strip(node)
        return False

    def kernel_access(self, name: str) -> list[Access | None] | None:
        """What a kernel defined in the program does through each parameter (None: not a pointer)."""
        fn = self.functions.get(name)
        if name not in self.kernels or fn is None:
            return None
        return [(Access(True, False) if p.const else _pointer_use(fn, p.name)) if p.pointer else None
                for p in self.kernels[name]]


def _params(fn) -> list[KernelParam]:
    decl = fn.child_by_field_name("declarator")
    while decl is not None and decl.type != "function_declarator":
        decl = decl.child_by_field_name("declarator")
    plist = decl.child_by_field_name("parameters") if decl is not None else None
    out = []
    for p in (plist.named_children if plist is not None else []):
        if p.type != "parameter_declaration":
            continue
        d = p.child_by_field_name("declarator")
        name = _declared_name(d) or ""
        pointer = d is not None and d.type == "pointer_declarator"
        const = any(c.type == "type_qualifier" and text(c) == "const" for c in p.children)
        out.append(KernelParam(name, pointer, pointer and const, element_type(p.child_by_field_name("type"), d)))
    return out


def _base(node) -> str | None:
    """The pointer a dereference goes through: `p[i]`, `*(p + i)`, `reinterpret_cast<T*>(p)[i].x` -> p."""
    node = strip(node)
    while node is not None:
        if node.type == "identifier":
            return text(node)
        if node.type == "subscript_expression" or node.type == "field_expression":
            node = strip(node.child_by_field_name("argument"))
        elif node.type == "pointer_expression":
            node = strip(node.child_by_field_name("argument"))
        elif node.type == "binary_expression":
            left = _base(node.child_by_field_name("left"))
            return left if left is not None else _base(node.child_by_field_name("right"))
        else:
            return None
    return None


def _is_deref(node) -> bool:
    """`p[i]`, `*p`, `p->f`, and a field of one of those (`p[i].x`)."""
    node = strip(node)
    if node is None:
        return False
    if node.type == "subscript_expression" or (node.type == "pointer_expression" and text(node)[:1] == "*"):
        return True
    if node.type == "field_expression":
        op = node.child_by_field_name("operator")
        return op is not None and (text(op) == "->" or _is_deref(node.child_by_field_name("argument")))
    return False


def _store_targets(target) -> set[int]:
    """The dereferences a plain store writes without reading: the target and, for `p[i].x`, the element under."""
    ids, node = set(), strip(target)
    while node is not None and _is_deref(node):
        ids.add(node.id)
        if node.type != "field_expression":
            break
        node = strip(node.child_by_field_name("argument"))
    return ids


def _pointer_names(body, param: str) -> set[str]:
    """The parameter and the local pointers the kernel derives from it (`const T* row = x + r * n`, `auto p = x`)."""
    names = {param}
    for node in walk(body):
        if node.type != "init_declarator":
            continue
        target, value = node.child_by_field_name("declarator"), node.child_by_field_name("value")
        decl_type = node.parent.child_by_field_name("type") if node.parent is not None else None
        pointer = target is not None and (target.type == "pointer_declarator" or (
            target.type == "identifier" and decl_type is not None and decl_type.type == "placeholder_type_specifier"))
        if pointer and value is not None and not _is_deref(value) and _base(value) in names:
            names.add(_declared_name(target))
    return names


def _stores(body, names: set[str]) -> tuple[bool, set[int]]:
    """Whether the body writes through the pointers, and the dereferences that plain stores only write."""
    writes, stores = False, set()
    for node in walk(body):
        if node.type not in ("assignment_expression", "update_expression"):
            continue
        target = node.child_by_field_name("left" if node.type == "assignment_expression" else "argument")
        if target is not None and _is_deref(target) and _base(target) in names:
            writes = True
            op = node.child_by_field_name("operator")
            if node.type == "assignment_expression" and op is not None and text(op) == "=":
                stores |= _store_targets(target)
    return writes, stores


def _passed(body, names: set[str]) -> tuple[bool, bool, bool]:
    """(reads, writes, opaque) of the calls the pointers are passed to: atomics read and write, load and store
    intrinsics read or write, any other call is not followed."""
    reads = writes = opaque = False
    for node in walk(body):
        if node.type != "call_expression" or node.child_by_field_name("arguments") is None or _cast_call(node):
            continue
        fn_name = callee(node).split("::")[-1]
        for arg in node.child_by_field_name("arguments").named_children:
            if _is_deref(arg) or _base(arg) not in names:
                continue
            atomic = fn_name.startswith("atomic")
            reads |= atomic or fn_name in READ_INTRINSICS
            writes |= atomic or fn_name in WRITE_INTRINSICS
            opaque |= not atomic and fn_name not in READ_INTRINSICS + WRITE_INTRINSICS
    return reads, writes, opaque


def _pointer_use(fn, param: str) -> Access:
    """Whether the kernel body reads or writes through the parameter: a store is an assignment to a dereference of
    it, a load any other dereference; a call it is passed to (but atomics and load/store intrinsics) is not
    followed, so both are assumed."""
    body = fn.child_by_field_name("body")
    if body is None:
        return Access(False, False)
    names = _pointer_names(body, param)
    writes, stores = _stores(body, names)
    call_reads, call_writes, opaque = _passed(body, names)
    if opaque:
        return Access(True, True, False)
    loads = any(_is_deref(n) and _base(n) in names and n.id not in stores for n in walk(body))
    return Access(loads or call_reads, writes or call_writes)


def uses_atomics(fn) -> bool:
    """The function accumulates with atomics: the order of its updates, and so its rounding, varies run to run."""
    return any(n.type == "call_expression" and callee(n).split("::")[-1].startswith("atomic") for n in walk(fn))


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
