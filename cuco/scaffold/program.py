"""A host-driven program read for its sizes and buffers: which dimension each count, allocation and GEMM argument
stands for, which buffer each pointer is, its element type, and what each kernel does with the pointers it gets.

The fast path's analysis says which buffers each call touches; a workload also needs their shapes, written as
expressions over named dimensions (workload.toml's language). Program parses the program once, on the same syntax
tree the analysis uses, and reads it in steps: its functions and calls, every name's definitions (definitions.py),
where each pointer points (buffer_refs.py); its queries then translate a call's sizes (translate.py) and say what a
kernel does through each pointer (kernel_access.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cuco.errors import CucoError
from cuco.fastpath.analyze import ALLOCATORS
from cuco.fastpath.syntax import TOO_DEEP, blank_macros, callee, function_name, parser, text, too_deep, walk
from cuco.scaffold.buffer_refs import BufferRefs, Ref
from cuco.scaffold.c_expr import cast_call, literal_arg, loops_around, peel
from cuco.scaffold.declarations import (
    BYTE_VIEWS,
    C_TYPES,
    INTEGER_TYPES,
    KernelParam,
    cast_desc,
    dtype_of,
    parameters,
)
from cuco.scaffold.definitions import Definitions
from cuco.scaffold.kernel_access import Access, param_access
from cuco.scaffold.size_expr import dims, param_name, tidy
from cuco.scaffold.translate import Dim, Translator

# C_TYPES, dims, param_name and tidy: re-exported for the standalone conversion, which imports them from here.
__all__ = ["C_TYPES", "Call", "Dim", "Program", "dims", "param_name", "tidy"]


def first_syntax_error(root) -> tuple[int, str] | None:
    """The first place the grammar did not understand in a syntax tree: its line and a short excerpt."""
    bad = next((n for n in walk(root) if n.type == "ERROR" or n.is_missing), None)
    if bad is None:
        return None
    return bad.start_point.row + 1, " ".join(text(bad).split())[:40] or f"a missing {bad.type}"


@dataclass
class Call:
    """One call of the program: where it is and its argument nodes."""

    name: str
    line: int
    function: str
    args: list
    loops: list  # the loops around it in its function, innermost first: it runs once per iteration of each


class Program:
    """The program's syntax tree: its calls by line and name, every name's definitions, the buffers it names and
    the pointers into them, and its kernels."""

    def __init__(self, path: Path, raw: bytes) -> None:
        self.path = path
        self.root = parser().parse(blank_macros(raw)).root_node
        deep = too_deep(self.root)
        if deep is not None:  # before any reader recurses over it
            raise CucoError(f"{path}:{deep}", TOO_DEEP)
        self.functions: dict[str, object] = {}
        self.calls: dict[tuple[int, str], Call] = {}
        self.handed: dict[str, list[int]] = {}  # cuco_buffer(ctx, "x"): x -> lines
        self.read_params: dict[str, list[int]] = {}  # cuco_param(ctx, "N"): N -> lines
        self.allocated: set[str] = set()  # what the program allocates itself (`d_x`, `s->buf`)
        self.kernels: dict[str, list[KernelParam]] = {}
        self.passed: dict[str, set[str]] = {}  # host function -> its pointer parameters: buffers its caller passes
        self.device_functions: set[str] = set()  # __device__ functions: called from kernels, not from the host
        fns = [n for n in walk(self.root) if n.type == "function_definition"]
        for fn in fns:
            self._read_function(fn)
        self.definitions = Definitions(self.root, fns)
        self.pointers = BufferRefs(fns, self.allocated, self.passed)

    def _read_function(self, fn) -> None:
        fname = function_name(fn)
        self.functions.setdefault(fname, fn)
        params = parameters(fn)
        qualifiers = {c.type for c in fn.children}
        if "__global__" in qualifiers:
            self.kernels[fname] = params
        elif "__device__" in qualifiers and "__host__" not in qualifiers:
            self.device_functions.add(fname)
        else:
            self.passed[fname] = {p.name for p in params if p.pointer and (dtype_of(p.ctype) or p.ctype in BYTE_VIEWS)}
        for node in walk(fn):
            if node.type == "call_expression":
                self._read_call(node, fn, fname)

    def _read_call(self, node, fn, fname: str) -> None:
        name, args, fn_node = callee(node), node.child_by_field_name("arguments"), node.child_by_field_name("function")
        if args is None or not name or cast_call(node) or fn_node.type == "primitive_type" or name in INTEGER_TYPES:
            return  # a cast, not a call
        line = node.start_point.row + 1
        named = [a for a in args.named_children if a.type != "comment"]
        self.calls.setdefault((line, name), Call(name, line, fname, named, loops_around(node, fn)))
        lit = literal_arg(node) if name in ("cuco_buffer", "cuco_param") else None
        if lit is not None:
            (self.handed if name == "cuco_buffer" else self.read_params).setdefault(lit, []).append(line)
        if name in ALLOCATORS and named:
            target = next((n for n in walk(named[0]) if n.type in ("field_expression", "identifier")), None)
            if target is not None:
                self.allocated.add(text(target).replace(" ", ""))

    def call(self, line: int, name: str) -> Call | None:
        return self.calls.get((line, name))

    def syntax_error(self) -> tuple[int, str] | None:
        return first_syntax_error(self.root)

    def translate(self, node, fname: str) -> Dim | None:
        """An expression of function fname as a workload expression, or None where it is not one."""
        tr = Translator(self.definitions)
        expr = tr.expr(node, fname)
        return tr.dim(expr) if expr is not None else None

    def dim(self, call: Call, position: int) -> Dim | None:
        """The size argument at `position` of a call, as a workload expression, or None where it is not one."""
        return self.translate(call.args[position], call.function) if position < len(call.args) else None

    def arg_ref(self, call: Call, position: int) -> Ref | None:
        return self.pointers.ref(call.function, call.args[position]) if position < len(call.args) else None

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
        tr = Translator(self.definitions)
        parts = [tr.expr(f, call.function) for f in factors if f is not sizes[0]] or ["1"]
        if any(p is None for p in parts):
            return None, C_TYPES.get(ctype)
        return tr.dim(" * ".join(parts)), C_TYPES.get(ctype)

    def call_site_const(self, call: Call, position: int) -> bool:
        """The argument is cast to a pointer to const where it is passed: the callee only reads through it."""
        node = call.args[position] if position < len(call.args) else None
        while node is not None:
            desc = cast_desc(node)
            if desc is not None and any(c.type == "type_qualifier" and text(c) == "const" for c in desc.children):
                return True
            inner = peel(node)  # one wrapper at a time: `((const T*)x)` is cast under its parentheses
            if inner is node:
                return False
            node = inner
        return False

    def kernel_access(self, name: str) -> list[Access | None] | None:
        """What a kernel defined in the program does through each parameter (None: not a pointer)."""
        fn = self.functions.get(name)
        if name not in self.kernels or fn is None:
            return None
        return param_access(fn, self.kernels[name])
