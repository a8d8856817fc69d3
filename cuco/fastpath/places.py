"""Where a pointer the program hands to NCCL points: a buffer (one the workload declares, or one the program
allocates) and a byte offset into it, or the reason the rules cannot say.

A device collective names a peer's memory as a window and an offset the caller computes; that is right only if
the expression names the same buffer on every rank and every call, and the offset is the same on every rank. So a
local pointer is followed only through its one definition (casts, `+ elements`), an offset only through values the
program defines once from shape parameters and the world size; a pointer assigned again, picked from an array, or
an offset that involves the rank or a loop variable is refused with the line that makes it so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cuco.fastpath.syntax import function_name as _name
from cuco.fastpath.syntax import parser, text, walk

# Calls an offset may contain: pure functions of the shape (cuco.h) and of types.
PURE_CALLS = ("cuco_param", "sizeof")
# Fields an offset may read, the same on every rank: the context's world size, a workload buffer's size and shape
# (cuco.h). ctx->rank, ctx->cudaDevice, a buffer's ptr differ between ranks.
SAME_ON_EVERY_RANK = {"ctx": ("nRanks",), "buffer": ("bytes", "ndim", "shape", "dtype")}
MAX_DEPTH = 16  # definitions followed through at most this many names
CONTEXT_TYPE = "cuco_ctx_t"


@dataclass(frozen=True)
class Place:
    """`base` is the cuco_buffer_t* of a workload buffer, a variable or the cuco_buffer call (its window:
    base->window), with `buffer` its name; or the expression of a buffer the program allocates (`s->scratch`),
    with `buffer` None. `offset` is in bytes, a C expression valid where the pointer is used ("0" for none)."""

    base: str
    buffer: str | None
    offset: str = "0"


@dataclass(frozen=True)
class Unplaced:
    reason: str


class Pointers:
    """The local pointers of one function: name -> Place, or Unplaced with its reason. `handles`: the variables
    holding cuco_buffer(ctx, "x"), each with its buffer's name."""

    def __init__(self, fn, handles: dict[str, str], allocated: set[str], scalars: dict[str, str | None]) -> None:
        self.handles, self.allocated, self.scalars = handles, allocated, scalars
        self.known: dict[str, Place | Unplaced] = {}
        self.types: dict[str, str] = {}  # pointer -> the element type it was declared with
        self.elements: dict[str, list[Place | Unplaced | None]] = {}  # array of pointers -> its initial elements
        self.reassigned: dict[str, str] = {}  # pointer -> why the buffer it names changes
        self.params = pointer_params(fn)  # buffers the caller passes in: their place is the caller's
        self.function = _name(fn)
        for node in walk(fn):
            if node.type == "init_declarator":
                self._declare(node)
            elif node.type == "declaration":
                self._learn_types(node)
            elif node.type == "assignment_expression" and _field_key(node.child_by_field_name("left")):
                self._assign_field(node)
            elif node.type == "assignment_expression":
                target = node.child_by_field_name("left")
                if target is not None and target.type == "subscript_expression":
                    target = target.child_by_field_name("argument")
                name = text(target) if target is not None and target.type == "identifier" else None
                if name is not None and (name in self.known or name in self.types or name in self.elements):
                    self.elements.pop(name, None)
                    self._changes(name, f"`{name}` is assigned again at line {node.start_point.row + 1}: which buffer "
                                        "it names changes")
            elif node.type == "pointer_expression" and text(node).startswith("&") and not _read_through(node):
                target = node.child_by_field_name("argument")
                if target is not None and text(target) in self.known:
                    self._changes(text(target), f"`{text(target)}` is written through its address at line "
                                                f"{node.start_point.row + 1}")

    def _assign_field(self, node) -> None:
        """`c.x = (float*)cuco_buffer(ctx, "x")->ptr;`: a struct's field holding a buffer, as a pointer declared from
        one would; assigned again, which buffer it names changes."""
        key = _field_key(node.child_by_field_name("left"))
        if key in self.known:
            self._changes(key, f"`{key}` is assigned again at line {node.start_point.row + 1}: which buffer it names "
                               "changes")
            return
        op = node.child_by_field_name("operator")
        place = self.place(node.child_by_field_name("right")) if op is not None and text(op) == "=" else None
        if place is not None:
            self.known[key] = place

    def _changes(self, name: str, reason: str) -> None:
        self.known[name] = Unplaced(reason)
        self.reassigned.setdefault(name, reason)

    def _learn_types(self, node) -> None:
        typ = node.child_by_field_name("type")
        for d in node.named_children:
            target = d.child_by_field_name("declarator") if d.type == "init_declarator" else d
            if typ is not None and target is not None and target.type == "pointer_declarator":
                name = next((text(n) for n in walk(target) if n.type == "identifier"), None)
                if name is not None:
                    self.types.setdefault(name, text(typ))

    def _declare(self, node) -> None:
        decl, value = node.child_by_field_name("declarator"), node.child_by_field_name("value")
        if decl is None or value is None:
            return
        name = next((text(n) for n in walk(decl) if n.type == "identifier"), None)
        if name is None:
            return
        line = node.start_point.row + 1
        if any(n.type == "array_declarator" for n in walk(decl)):  # `void* bufs[2]`: an array of pointers
            self.known[name] = Unplaced(f"`{name}` is an array of buffers (line {line}): which one a call uses is "
                                        "chosen at run time")
            if value.type == "initializer_list":
                self.elements[name] = [self.place(v) for v in value.named_children]
        elif decl.type == "pointer_declarator":
            place = self.place(value)
            if place is not None:
                self.known[name] = place

    def place(self, node) -> Place | Unplaced | None:
        """The place an expression points to; None where it is not a pointer into a known buffer."""
        node = strip(node)
        if node.type == "field_expression" and text(node).replace(" ", "").endswith("->ptr"):
            handle = node.child_by_field_name("argument")
            if text(handle) in self.handles:
                return Place(text(handle), self.handles[text(handle)])
            name = _buffer_call(handle)
            return Place(text(handle), name) if name else None
        key = text(node).replace(" ", "")
        if key in self.allocated:
            return Place(key, None)
        if node.type == "field_expression" and key in self.known:  # a field assigned a buffer (`c.x`)
            return self.known[key]
        if node.type == "identifier" and text(node) in self.params:
            return Unplaced(f"`{text(node)}` is a parameter of {self.function}(): the rules do not follow buffers "
                            "into the functions they are passed to (call the collective where the buffer is known)")
        if node.type == "identifier":
            return self.known.get(text(node))
        if node.type == "subscript_expression":
            arr, indices = node.child_by_field_name("argument"), node.child_by_field_name("indices")
            key = text(arr).replace(" ", "") if arr is not None else ""
            fixed = fixed_index(node)
            if key in self.elements and fixed is not None and fixed < len(self.elements[key]):
                return self.elements[key][fixed]  # bufs[1] of an array never assigned again
            if key in self.elements:
                index = text(indices)[1:-1].strip() if indices is not None else "?"
                return Unplaced(f"`{text(node)}` picks one of the buffers of `{key}` by `{index}`: which one is "
                                "chosen at run time")
            if key in self.known:
                return self.known[key]
            if key in self.allocated:
                return Unplaced(f"`{text(node)}` picks one of the buffers allocated into `{key}`: which one is "
                                "chosen at run time")
            return None
        if node.type == "binary_expression" and text(node.child_by_field_name("operator")) == "+":
            return self._advanced(node)
        return None

    def _advanced(self, node) -> Place | Unplaced | None:
        """`p + k` with p a pointer into a known buffer: k elements of the type p points to further on."""
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        base = self.place(left)
        if not isinstance(base, Place):
            return base
        elem = element_type(strip_parens(left), self.types)
        if elem is None:
            moving = self.same_on_every_rank(text(right))
            return Unplaced(f"`{text(node)}` lies at an offset that depends on {moving}" if moving else
                            f"`{text(node)}`: arithmetic on a pointer whose element type the rules cannot see (cast "
                            "it to a typed pointer)")
        step = f"({text(right)}) * sizeof({elem})"
        return Place(base.base, base.buffer, step if base.offset == "0" else f"{base.offset} + {step}")

    def reach(self, expr: str) -> Place | Unplaced | None:
        """The place of an argument as written at a call (parsed on its own)."""
        tree = parser().parse(f"void f() {{ ({expr}); }}".encode()).root_node
        stmt = next((n for n in walk(tree) if n.type == "parenthesized_expression"), None)
        return self.place(stmt) if stmt is not None else None

    def same_on_every_rank(self, offset: str) -> str | None:
        """None if the offset is the same on every rank, else why the rules cannot show it."""
        return why_offset_varies(offset, self.scalars, self.handles)


def _field_key(node) -> str | None:
    """`c.x` for the field of a struct variable (not through a pointer), as its key among the known pointers."""
    if node is None or node.type != "field_expression" or text(node.child_by_field_name("operator")) != "." or \
            node.child_by_field_name("argument").type != "identifier":
        return None
    return "".join(text(node).split())


def fixed_index(node) -> int | None:
    """The index of `bufs[1]`, a subscript by a literal (the same element every time); None for any other."""
    indices = node.child_by_field_name("indices")
    index = indices.named_children[0] if indices is not None and indices.named_child_count == 1 else None
    return int(text(index)) if index is not None and index.type == "number_literal" and text(index).isdigit() else None


def pointer_params(fn) -> set[str]:
    """The function's pointer parameters but the candidate's context (cuco.h's cuco_ctx_t*, not a buffer)."""
    decl = fn.child_by_field_name("declarator")
    return {text(i) for p in walk(decl) if p.type == "parameter_declaration" and CONTEXT_TYPE not in text(p)
            for d in [p.child_by_field_name("declarator")] if d is not None and d.type == "pointer_declarator"
            for i in walk(d) if i.type == "identifier"}


def _buffer_call(node) -> str | None:
    """The buffer `cuco_buffer(ctx, "name")` looks up, if node is that call."""
    fn = node.child_by_field_name("function") if node.type == "call_expression" else None
    if fn is None or text(fn) != "cuco_buffer":
        return None
    lit = next((n for n in walk(node) if n.type == "string_content"), None)
    return text(lit) if lit is not None else None


def strip_parens(node):
    while node.type == "parenthesized_expression" and node.named_child_count == 1:
        node = node.named_children[0]
    return node


CPP_CASTS = ("static_cast", "reinterpret_cast", "const_cast")


def _cpp_cast(node) -> tuple[object, str] | None:
    """The operand and the type of a C++ cast (`reinterpret_cast<__half*>(x)`), or None for any other node."""
    fn = node.child_by_field_name("function") if node.type == "call_expression" else None
    if fn is None or fn.type != "template_function" or text(fn.child_by_field_name("name")) not in CPP_CASTS:
        return None
    args = node.child_by_field_name("arguments").named_children
    return (args[0], text(fn.child_by_field_name("arguments"))[1:-1]) if len(args) == 1 else None


def strip(node):
    """Parentheses and casts around a pointer: `(T*)(x->ptr)` and `static_cast<T*>(x->ptr)` are x->ptr."""
    while True:
        node = strip_parens(node)
        if node.type == "cast_expression":
            node = node.child_by_field_name("value")
        elif _cpp_cast(node) is not None:
            node = _cpp_cast(node)[0]
        else:
            return node


def element_type(node, types: dict[str, str]) -> str | None:
    """The element type pointer arithmetic on `node` steps by: the cast's (`(T*)p`, `static_cast<T*>(p)` step by
    T), a typed local's."""
    cpp = _cpp_cast(node)
    if node.type == "cast_expression" or cpp is not None:
        typ = text(node.child_by_field_name("type")) if cpp is None else cpp[1]
        t = " ".join(re.sub(r"\bconst\b", " ", typ).split())
        elem = t[:-1].strip()
        return elem if t.endswith("*") and t.count("*") == 1 and elem != "void" else None
    if node.type == "identifier" and node.text.decode() in types:
        return types[text(node)].replace("const ", "").strip()
    return None


def why_offset_varies(offset: str, scalars: dict[str, str | None], handles: dict[str, str]) -> str | None:
    """Expands the names an offset uses through their one definition; refuses the rank, loop variables, anything
    assigned more than once, and calls other than pure ones. Workload buffers (`x->bytes`) are the same size on
    every rank."""
    expr = _no_strings(offset)
    for _ in range(MAX_DEPTH):
        names = [n for n in re.findall(r"(?<![\w>.])([A-Za-z_]\w*)\b(?!\s*\()", expr)
                 if n not in ("sizeof", "ctx") and (n in scalars or not _is_type(n))]  # a variable named `half`
        unresolved = [n for n in names if n in scalars]
        if not unresolved:
            break
        for n in unresolved:
            if scalars[n] is None:
                return f"`{n}`, which the program assigns more than once (a loop or a reassignment)"
            value = f"({_no_strings(scalars[n])})"
            expr = re.sub(rf"(?<![\w>.]){re.escape(n)}\b", lambda _, value=value: value, expr)
    else:
        return "definitions nested too deep to follow"
    if re.search(r"->\s*rank\b", expr):
        return "the rank (ctx->rank): a peer would compute another offset"
    for call in re.findall(r"([A-Za-z_]\w*)\s*\(", expr):
        if call not in PURE_CALLS and not _is_type(call):
            return f"a call of {call}(), whose value the rules cannot know to be the same on every rank"
    # a parameter is the same on every rank: `cuco_param(ctx, "N")` reads ctx for no rank's value
    plain = re.sub(r"\bcuco_param\s*\(\s*ctx\s*,\s*\"\"\s*\)", "0", expr)
    for name in re.findall(r"(?<![\w>.])([A-Za-z_]\w*(?:\s*(?:->|\.)\s*\w+)*)", plain):
        parts = re.split(r"\s*(?:->|\.)\s*", name)
        owner = "ctx" if parts[0] == "ctx" else "buffer" if parts[0] in handles else None
        if parts[0] in PURE_CALLS or _is_type(name):
            continue
        if owner is None or len(parts) != 2 or parts[1] not in SAME_ON_EVERY_RANK[owner]:
            return f"`{name}`, which the rules cannot follow to one value on every rank"
    return None


def _no_strings(expr: str) -> str:
    """String literals emptied: `cuco_param(ctx, "N")` names no variable N."""
    return re.sub(r'"[^"]*"', '""', expr)


TYPES = re.compile(r"(?:const|unsigned|signed|int|long|short|char|float|double|size_t|u?int(?:8|16|32|64)_t|"
                   r"__nv_bfloat16|__half|half|void|bool)$")


def _is_type(name: str) -> bool:
    """Type names: what an offset may contain besides definitions, pure calls and fields (ctx->nRanks)."""
    return bool(TYPES.match(name))


# Calls whose argument at the position reads the pointer an address names and never changes it: a copy's source.
READ_SOURCES = {"cudaMemcpyToSymbol": 1, "cudaMemcpyToSymbolAsync": 1, "cudaMemcpy": 1, "cudaMemcpyAsync": 1}


def _read_through(address) -> bool:
    """`&p` given where p is only read: the source of a copy to a symbol or to memory (the pointer's value is
    copied), or an element of an array of kernel arguments (`void* args[] = {&p, ...}`, the kernel gets p's value)."""
    up = address.parent
    if up is not None and up.type == "initializer_list":
        return True
    if up is None or up.type != "argument_list" or up.parent is None or up.parent.type != "call_expression":
        return False
    function = up.parent.child_by_field_name("function")
    args = [a for a in up.named_children if a.type != "comment"]
    position = READ_SOURCES.get(text(function)) if function is not None else None
    return position is not None and position < len(args) and args[position].id == address.id
