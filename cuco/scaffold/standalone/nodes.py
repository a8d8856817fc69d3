"""The syntax-tree helpers that the conversion's modules share beyond cuco.fastpath.syntax's: where a node stands,
which names and strings it holds, whether a call launches a kernel."""

from __future__ import annotations

from cuco.fastpath.syntax import call_args, text, walk


def line_of(node) -> int:
    return node.start_point.row + 1


def is_launch(call) -> bool:
    return any(c.type == "kernel_call_syntax" for c in call.children)


def calls_in(node) -> list:
    return [n for n in walk(node) if n.type == "call_expression"]


def idents(node) -> set[str]:
    return {text(n) for n in walk(node) if n.type == "identifier"} if node is not None else set()


def names_in(node) -> set[str]:
    """The names an expression reads: its identifiers, and its fields of a struct as `cfg.tokens`."""
    if node is None:
        return set()
    return {text(n) if n.type == "identifier" else "".join(text(n).split()) for n in walk(node)
            if n.type in ("identifier", "field_expression")}


CASTS = ("static_cast", "reinterpret_cast", "const_cast")


def address_of(arg) -> str | None:
    """The variable `&x` names (or the field `&c.comm`, as `c.comm`), the argument itself under casts and
    parentheses, or None: an address taken inside it (`(&cfg)->rank`, a field read through a pointer to a struct)
    is not the argument's."""
    node = arg
    while node is not None:
        if node.type in ("cast_expression", "parenthesized_expression"):
            node = node.child_by_field_name("value") or next(iter(node.named_children), None)
        elif node.type == "call_expression" and text(node.child_by_field_name("function")).startswith(CASTS):
            node = next(iter(call_args(node)), None)
        else:
            break
    if node is None or node.type != "pointer_expression" or not text(node).startswith("&"):
        return None
    target = node.child_by_field_name("argument")
    if target is not None and target.type == "field_expression" and text(target.child_by_field_name("operator")) \
            == "." and target.child_by_field_name("argument").type == "identifier":
        return "".join(text(target).split())
    return text(target) if target is not None and target.type == "identifier" else None


def root_name(arg) -> str | None:
    return next((text(n) for n in walk(arg) if n.type == "identifier"), None)


def strings_in(node) -> set[str]:
    return {text(n) for n in walk(node) if n.type == "string_content"}
