"""The syntax-tree helpers that the conversion's modules share: what a call is called and given, where a node
stands, which names and strings it holds."""

from __future__ import annotations

from cuco.fastpath.syntax import text, walk


def line_of(node) -> int:
    return node.start_point.row + 1


def callee(call) -> str:
    fn = call.child_by_field_name("function")
    if fn is not None and fn.type == "template_function":
        fn = fn.child_by_field_name("name")
    return text(fn) if fn is not None else ""


def call_args(call) -> list:
    lst = call.child_by_field_name("arguments")
    return [a for a in lst.named_children if a.type != "comment"] if lst is not None else []


def is_launch(call) -> bool:
    return any(c.type == "kernel_call_syntax" for c in call.children)


def calls_in(node) -> list:
    return [n for n in walk(node) if n.type == "call_expression"]


def idents(node) -> set[str]:
    return {text(n) for n in walk(node) if n.type == "identifier"} if node is not None else set()


def address_of(arg) -> str | None:
    """The variable `&x` (under casts) names, or None."""
    ptr = next((n for n in walk(arg) if n.type == "pointer_expression" and text(n).startswith("&")), None)
    target = ptr.child_by_field_name("argument") if ptr is not None else None
    return text(target) if target is not None and target.type == "identifier" else None


def root_name(arg) -> str | None:
    return next((text(n) for n in walk(arg) if n.type == "identifier"), None)


def strings_in(node) -> set[str]:
    return {text(n) for n in walk(node) if n.type == "string_content"}
