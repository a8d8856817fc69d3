"""What a kernel the program defines does through each pointer parameter: reads, writes, or both where the pointer
goes where the rules do not follow.

A buffer's role in a step (input, output, both) comes from the kernels that touch it; this module reads a kernel's
body for the dereferences of each pointer parameter and of the local pointers derived from it, and for the calls
they are passed to.
"""

from __future__ import annotations

from dataclasses import dataclass

from cuco.fastpath.syntax import callee, text, walk
from cuco.scaffold.c_expr import cast_call, strip
from cuco.scaffold.declarations import INTEGER_TYPES, KernelParam, declared_name

READ_INTRINSICS = ("__ldg", "__ldca", "__ldcg", "__ldcs", "__ldlu", "__ldcv")
WRITE_INTRINSICS = ("__stwb", "__stcg", "__stcs", "__stwt")


@dataclass(frozen=True)
class Access:
    reads: bool
    writes: bool
    sure: bool = True  # False: the pointer goes where the rules do not follow; both are assumed


def param_access(fn, params: list[KernelParam]) -> list[Access | None]:
    """What the kernel fn does through each of its parameters (None: not a pointer). Read once per kernel: a step
    launches one kernel many times."""
    key = (fn.text, tuple(params))
    if key not in _ACCESS:
        if len(_ACCESS) >= ACCESS_CACHE:
            _ACCESS.clear()
        _ACCESS[key] = [(Access(True, False) if p.const else _pointer_use(fn, p.name)) if p.pointer else None
                        for p in params]
    return _ACCESS[key]


ACCESS_CACHE = 4096  # kernels remembered: more than a program defines
_ACCESS: dict[tuple, list[Access | None]] = {}


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
            names.add(declared_name(target))
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
        if node.type != "call_expression" or node.child_by_field_name("arguments") is None or cast_call(node):
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


def uses_atomics(fn, params: list[KernelParam]) -> bool:
    """The function accumulates in floating point with atomics: the order of its updates, and so its rounding,
    varies run to run. Atomics into a pointer parameter of an integer type (a count, a histogram) are exact in any
    order; any other target is assumed to round."""
    ints = {p.name for p in params if p.pointer and p.ctype in INTEGER_TYPES}
    return any(n.type == "call_expression" and callee(n).split("::")[-1].startswith("atomic") and not (
        (args := n.child_by_field_name("arguments")) is not None and args.named_children
        and _base(args.named_children[0]) in ints) for n in walk(fn))
