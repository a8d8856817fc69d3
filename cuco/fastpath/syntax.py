"""The CUDA C++ syntax tree (tree-sitter's CUDA grammar) and the few node helpers the fast path shares."""

from __future__ import annotations

from cuco.extras import require

# Attribute-like macros the grammar does not know; blanked (same length, so byte offsets hold) before parsing.
ATTRIBUTE_MACROS = ("CUCO_EXPORT",)


def parser():
    ts = require("tree_sitter")
    tsc = require("tree_sitter_cuda")
    return ts.Parser(ts.Language(tsc.language()))


def blank_macros(src: bytes) -> bytes:
    for m in ATTRIBUTE_MACROS:
        src = src.replace(m.encode(), b" " * len(m))
    return src


def is_zero_literal(s: str) -> bool:
    """A C number literal that is zero (`0`, `0.0f`, `0.`, `0x0`)."""
    s = s.strip().lower().rstrip("ul")
    if s.startswith("0x"):
        return s[2:] != "" and s[2:].strip("0") == ""
    return s[:1].isdigit() and s.rstrip("f").replace(".", "").strip("0") == ""


def text(node) -> str:
    return node.text.decode(errors="replace")


MAX_NESTING = 200  # how deep a program's syntax may nest: the readers of expressions recurse (Python's limit: 1000)
TOO_DEEP = f"nests more than {MAX_NESTING} levels deep: cuco reads programs up to that depth (split the expression)"


def too_deep(root) -> int | None:
    """The line where a syntax tree nests deeper than MAX_NESTING (a generated expression of thousands of terms),
    or None."""
    stack = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_NESTING:
            return node.start_point.row + 1
        stack.extend((c, depth + 1) for c in node.children)
    return None


def walk(node):
    """The node and everything below it, in source order: a stack, not recursion (a long expression of a user's
    program nests deeper than Python's recursion limit)."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.children))


def counting_loop(loop) -> tuple[str | None, object | None]:
    """A `for` loop that counts its variable up by one from zero while it is below a bound (`for (int p = 0; p <
    n; ++p)`, `p != n` too): the variable and the bound's node. The variable is None where the loop does not count
    so, the bound None where its condition is not `var < bound`."""
    if loop.type != "for_statement":
        return None, None
    init, cond, step = (loop.child_by_field_name(f) for f in ("initializer", "condition", "update"))
    var = None
    if init is not None and init.type == "declaration" and init.named_child_count >= 2:
        d = init.named_children[-1]
        if d.type == "init_declarator" and text(d.child_by_field_name("value")).strip() == "0":
            var = text(d.child_by_field_name("declarator"))
    elif init is not None and init.type == "assignment_expression" and text(init.child_by_field_name("right")) == "0":
        var = text(init.child_by_field_name("left"))
    if var is None or step is None or "".join(text(step).split()) not in (f"{var}++", f"++{var}", f"{var}+=1",
                                                                          f"{var}={var}+1"):
        return None, None
    op = cond.child_by_field_name("operator") if cond is not None and cond.type == "binary_expression" else None
    if op is None or text(op) not in ("<", "!=") or text(cond.child_by_field_name("left")) != var:
        return var, None
    return var, cond.child_by_field_name("right")


def callee(node) -> str:
    """The function a call expression names, without template arguments (`f<T>(x)` -> f) or the global scope's
    `::` (`::ncclSend` is ncclSend); "" for any other node."""
    fn = node.child_by_field_name("function") if node is not None and node.type == "call_expression" else None
    if fn is not None and fn.type == "template_function":
        fn = fn.child_by_field_name("name")
    return text(fn).removeprefix("::") if fn is not None else ""


def call_args(call) -> list:
    """A call's arguments, comments left out."""
    lst = call.child_by_field_name("arguments")
    return [a for a in lst.named_children if a.type != "comment"] if lst is not None else []


def function_name(fn) -> str:
    decl = fn.child_by_field_name("declarator")
    while decl is not None and decl.type != "function_declarator":
        decl = decl.child_by_field_name("declarator")
    name = decl.child_by_field_name("declarator") if decl is not None else None
    return text(name) if name is not None else "?"
