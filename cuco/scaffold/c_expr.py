"""C expressions as the scaffold reads them: under their parentheses and casts, a call by the function it names and
the string it is given, a statement by the loop it runs in.

A program writes the same pointer or size many ways (`(T*)(x->ptr)`, `static_cast<T*>(x->ptr)`); every reader of
the program sees through those the same way, so what counts as a wrapper is decided once, here.
"""

from __future__ import annotations

from cuco.fastpath.analyze import LOOPS
from cuco.fastpath.syntax import text, walk

CASTS = ("static_cast", "reinterpret_cast", "const_cast")


def literal_arg(call_node) -> str | None:
    """The string literal a call names (`cuco_buffer(ctx, "x")` -> x)."""
    lit = next((n for n in walk(call_node) if n.type == "string_content"), None)
    return text(lit) if lit is not None else None


def cast_call(node) -> bool:
    """`static_cast<T>(x)` and its kin."""
    fn = node.child_by_field_name("function") if node is not None and node.type == "call_expression" else None
    return fn is not None and fn.type == "template_function" and text(fn).startswith(CASTS)


def only_arg(node):
    args = node.child_by_field_name("arguments")
    named = [a for a in args.named_children if a.type != "comment"] if args is not None else []
    return named[0] if len(named) == 1 else None


def peel(node):
    """What one pair of parentheses or one cast wraps (None where the rules cannot tell); node itself where it is
    neither."""
    if node.type == "parenthesized_expression":
        inner = [c for c in node.named_children if c.type != "comment"]
        return inner[0] if len(inner) == 1 else None
    if node.type == "cast_expression":
        return node.child_by_field_name("value")
    return only_arg(node) if cast_call(node) else node


def strip(node):
    """Parentheses and casts around an expression: `(T*)(x->ptr)` and `static_cast<T*>(x->ptr)` are x->ptr."""
    while node is not None:
        inner = peel(node)
        if inner is node:
            return node
        node = inner
    return None


def loops_around(node, fn) -> list:
    """The for, while and do loops of fn around node, innermost first: it runs once per iteration of each."""
    out, parent = [], node.parent
    while parent is not None and parent != fn:
        if parent.type in LOOPS:
            out.append(parent)
        parent = parent.parent
    return out

