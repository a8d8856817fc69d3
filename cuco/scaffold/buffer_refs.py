"""Which buffer each pointer of a host-driven program points into, whether at its start, and the element types the
program uses each workload buffer's pointer as.

A call's sizes are a buffer's shape only where the call is given the buffer's start; a pointer moved into it, or one
the rules cannot follow, makes them a piece's. The pointers come from `cuco_buffer(ctx, "x")->ptr`, a handle held in
a local or a field of the program's state, what the program allocates itself, and a host function's pointer
parameters (its caller passes buffers in).
"""

from __future__ import annotations

from dataclasses import dataclass

from cuco.fastpath.syntax import callee, function_name, text, walk
from cuco.scaffold.c_expr import cast_call, literal_arg, strip
from cuco.scaffold.declarations import cast_type, declared_name, element_type
from cuco.scaffold.size_expr import int_literal


@dataclass(frozen=True)
class Ref:
    """A pointer into a buffer: the whole of it (its start), or a piece (`x + offset`, a pointer moved later)."""

    buffer: str
    whole: bool = True


class BufferRefs:
    """The program's pointers by function, the handles and pointers it keeps in fields, and each buffer's casts."""

    def __init__(self, functions: list, allocated: set[str], passed: dict[str, set[str]]) -> None:
        self.allocated = allocated  # what the program allocates itself (`d_x`, `s->buf`)
        self.passed = passed  # host function -> its pointer parameters: buffers its caller passes
        self.handles: dict[str, dict[str, str]] = {}  # function -> variable holding cuco_buffer(ctx, "x") -> x
        self.aliases: dict[str, dict[str, Ref]] = {}  # function -> pointer variable -> where it points
        self.field_refs: dict[str, tuple[str, object]] = {}  # field -> ("handle", buffer) or ("ref", Ref | None)
        self.casts: dict[str, list[tuple[str, int]]] = {}  # buffer -> element types it is used as, with lines
        for _ in range(2):  # twice: a field set in a function defined after the one that uses it
            for fn in functions:
                self._read_pointers(fn)
        for fn in functions:
            self._read_casts(fn)

    def _read_pointers(self, fn) -> None:
        """Where the function's local pointers point, in the order they are defined (one assigned again points
        somewhere inside its buffer), and the pointers and handles it keeps in the fields of its state."""
        fname = function_name(fn)
        handles, aliases = self.handles.setdefault(fname, {}), {}
        for node in walk(fn):
            if node.type == "init_declarator":
                name, value = declared_name(node.child_by_field_name("declarator")), node.child_by_field_name("value")
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
            if parent.type == "cast_expression" or cast_call(parent):
                found = cast_type(parent) or found
            elif parent.type == "argument_list" and parent.parent is not None and cast_call(parent.parent):
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
                at_start = int_literal(text(inner.child_by_field_name("indices") or inner).strip("[] ")) == 0
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
