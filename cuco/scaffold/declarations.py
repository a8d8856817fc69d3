"""What the program declares: the names its declarators introduce and their first values, its functions'
parameters, and the element types its pointers, casts and sizeofs name, with the workload dtype each holds.

A buffer's dtype is never stated by the program; it is read off the types the program gives the pointers into it.
The C type names, and which of them are byte views rather than element types, are kept here for every reader.
"""

from __future__ import annotations

from dataclasses import dataclass

from cuco.dtypes import DTYPES
from cuco.fastpath.syntax import text, walk
from cuco.scaffold.c_expr import cast_call

# C element types and the workload dtype they hold (sizeof(...) and pointer types).
C_TYPES = {**{d.c_type: d.name for d in DTYPES.values()}, "nv_bfloat16": "bf16", "bfloat16": "bf16", "half": "f16",
           "int": "i32", "long long": "i64", "char": "i8", "signed char": "i8", "unsigned char": "u8"}
BYTE_VIEWS = frozenset({"char", "signed char", "unsigned char", "void"})  # a pointer cast for byte arithmetic
INTEGER_TYPES = frozenset({"size_t", "int", "long", "unsigned", "unsigned int", "int64_t", "int32_t", "uint64_t",
                           "uint32_t", "ptrdiff_t", "ssize_t", "long long", "unsigned long", "unsigned long long",
                           "long int"})


@dataclass(frozen=True)
class KernelParam:
    name: str
    pointer: bool
    const: bool  # points to const: read only
    ctype: str | None  # the element type a pointer parameter points to


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


def cast_desc(node):
    """The type a cast converts to: `(T*)x`, `static_cast<T*>(x)`."""
    if node is None:
        return None
    if node.type == "cast_expression":
        return node.child_by_field_name("type")
    if cast_call(node):
        targs = node.child_by_field_name("function").child_by_field_name("arguments")
        return next((c for c in targs.named_children if c.type == "type_descriptor"), None) if targs else None
    return None


def cast_type(node) -> str | None:
    """The element type a pointer cast converts to."""
    desc = cast_desc(node)
    return element_type(desc.child_by_field_name("type"), desc.child_by_field_name("declarator")) if desc else None


def declared_name(declarator) -> str | None:
    ident = next((n for n in walk(declarator) if n.type == "identifier"), None) if declarator is not None else None
    return text(ident) if ident is not None else None


def initializer(decl_value):
    """An initializer's expression: `n{x}` and `n = {x}` are x."""
    if decl_value is not None and decl_value.type == "initializer_list":
        inner = [c for c in decl_value.named_children if c.type != "comment"]
        return inner[0] if len(inner) == 1 else None
    return decl_value


def parameters(fn) -> list[KernelParam]:
    """A function definition's parameters: each one's name, whether it is a pointer (to const) and to what."""
    decl = fn.child_by_field_name("declarator")
    while decl is not None and decl.type != "function_declarator":
        decl = decl.child_by_field_name("declarator")
    plist = decl.child_by_field_name("parameters") if decl is not None else None
    out = []
    for p in (plist.named_children if plist is not None else []):
        if p.type != "parameter_declaration":
            continue
        d = p.child_by_field_name("declarator")
        name = declared_name(d) or ""
        pointer = d is not None and d.type == "pointer_declarator"
        const = any(c.type == "type_qualifier" and text(c) == "const" for c in p.children)
        out.append(KernelParam(name, pointer, pointer and const, element_type(p.child_by_field_name("type"), d)))
    return out
