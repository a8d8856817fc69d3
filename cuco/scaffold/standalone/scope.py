"""The program's file-scope code that the seed keeps as written (kernels, types, constants, the host functions
kept code calls), without main(), its check macros and the headers of what the runner owns."""

from __future__ import annotations

import re

from cuco.fastpath.syntax import function_name, text, walk
from cuco.scaffold.standalone.nodes import idents
from cuco.scaffold.standalone.program import Standalone

# Headers of what the runner owns (MPI, processes, files, sockets): left out of the seed.
RUNNER_HEADERS = re.compile(r"^(mpi.*|unistd|fcntl|netdb|signal|pthread|dlfcn|thread|chrono|(sys|netinet|arpa)/.*)"
                            r"(\.h)?$")


def file_scope(prog: Standalone, used: set[str]) -> list[str]:
    """The program's file-scope code the seed keeps, as written: the kernels, device and host functions kept code uses,
    types and constants; not main(), the program's check macros, nor the headers of MPI, processes,
    files and sockets. `#include "cuco.h"` follows the last include kept."""
    top = _items(prog.root)
    items = [n for n in top if n.type != "comment"]
    kept = {n.id for n in items if _scope_kind(prog, n) == "keep"}
    while True:
        names = used | set().union(*(idents(n) for n in items if n.id in kept))
        more = {n.id for n in items if _scope_kind(prog, n) == "maybe" and _defined(n) & names} - kept
        if not more:
            break
        kept |= more
    spaces = [(text(n.child_by_field_name("name")), n.id in kept) for n in items
              if n.type == "namespace_definition" and n.child_by_field_name("name") is not None]
    dropped = {name for name, held in spaces if not held} - {name for name, held in spaces if held}  # one file's
    kept -= {n.id for n in items if n.type == "using_declaration"  # `using namespace util;` of a namespace left out
             and re.fullmatch(r"using\s+namespace\s+(\w+)\s*;", text(n)) and text(n).split()[-1].rstrip(";") in dropped}
    chosen = [n for n in top if n.id in kept or (n.type == "comment" and _attached(n, kept))]
    included = [_included(n) for n in chosen]  # a header the files of a program each include is kept once
    chosen = [n for i, n in enumerate(chosen) if included[i] is None or included[i] not in included[:i]]
    last_include = max((i for i, n in enumerate(chosen) if n.type == "preproc_include"), default=-1)
    lines: list[str] = ["#include \"cuco.h\""] if last_include < 0 else []
    for i, node in enumerate(chosen):
        body = prog.src[node.start_byte:node.end_byte].decode(errors="replace").rstrip()
        if node.type == ";" and lines:  # the end of a struct's definition, on the line of its `}`
            lines[-1] += body
            continue
        if i and _blank_between(prog.src, chosen[i - 1], node):
            lines.append("")
        lines += body.split("\n")
        if i == last_include:
            lines.append("#include \"cuco.h\"")
    return lines


def _items(root) -> list:
    """The file's items; those of an `extern "C" { ... }` block holding main() as the file's own (the block is
    main()'s linkage, which the seed has no use for)."""
    out = []
    for node in root.children:
        body = node.child_by_field_name("body") if node.type == "linkage_specification" else None
        if body is not None and body.type == "declaration_list" and "main" in {
                function_name(f) for f in body.named_children if f.type == "function_definition"}:
            out += [n for n in body.children if n.type not in ("{", "}")]
        else:
            out.append(node)
    return out


def _included(node) -> str | None:
    path = node.child_by_field_name("path") if node.type == "preproc_include" else None
    return text(path) if path is not None else None


def _blank_between(src: bytes, before, after) -> bool:
    """Whether the program has a blank line between two items (an include's text ends with its newline)."""
    gap = src[before.end_byte - 1:after.start_byte].decode(errors="replace")
    return re.search(r"\n[ \t]*\n", gap if gap.startswith("\n") else gap[1:]) is not None


def _end_row(node) -> int:
    return node.end_point.row - (1 if node.end_point.column == 0 else 0)


def _attached(comment, kept: set[int]) -> bool:
    """A comment directly above a kept item (no blank line between) belongs to it."""
    node = comment
    while node is not None and node.type == "comment":
        nxt = node.next_sibling
        if nxt is None or nxt.start_point.row > _end_row(node) + 1:
            return False
        node = nxt
    return node is not None and node.id in kept


def _defined(node) -> set[str]:
    """The function a file-scope item declares or defines, without template arguments (`to_f<float>` is to_f)."""
    if _prototype(node) or node.type == "template_instantiation":  # `template void f<float>(...);` too
        return {function_name(_declaration(node)).split("<")[0]}
    if node.type == "namespace_definition":  # every function it defines
        return {function_name(f).split("<")[0] for f in walk(node) if f.type == "function_definition"}
    fn = node if node.type == "function_definition" else next(
        (n for n in walk(node) if n.type == "function_definition"), None)
    return {function_name(fn).split("<")[0]} if fn is not None else set()


def _declaration(node):
    """The declaration a template declares (`template <typename T> __device__ float to_f(T v);`), or the node."""
    if node.type == "template_declaration":
        return next((c for c in node.named_children if c.type == "declaration"), node)
    return node


def _prototype(node) -> bool:
    """A function's declaration without its body (a header's `void launch(float* x, int n);`, a template's)."""
    node = _declaration(node)
    decl = node.child_by_field_name("declarator") if node.type == "declaration" else None
    return decl is not None and decl.type == "function_declarator"


def _scope_kind(prog: Standalone, node) -> str:
    """keep, drop, or maybe (a host function: kept where kept code calls it)."""
    if node.type == "preproc_include":
        path = node.child_by_field_name("path")
        return "drop" if path is not None and RUNNER_HEADERS.match(text(path).strip("<>\"")) else "keep"
    if node.type == "preproc_function_def":
        name = node.child_by_field_name("name")
        return "drop" if name is not None and text(name) in prog.wrappers else "keep"
    if node.type == "namespace_definition":  # functions only (a check helper): kept where kept code uses one
        body = node.child_by_field_name("body")
        items = [c for c in (body.named_children if body is not None else []) if c.type != "comment"]
        functions = all(c.type == "function_definition" or _prototype(c) or (
            c.type == "template_declaration" and any(g.type == "function_definition" for g in c.named_children))
            for c in items)
        return "maybe" if items and functions else "keep"
    if node.type == "linkage_specification":  # `extern "C" int main(...)`: the item it declares
        body = node.child_by_field_name("body")
        return _scope_kind(prog, body) if body is not None and body.type != "declaration_list" else "keep"
    if _prototype(node):
        return "maybe"
    if node.type in ("function_definition", "template_declaration", "template_instantiation"):
        return "drop" if "main" in _defined(node) else "maybe"  # kept where kept code uses it (a kernel the step
    return "keep"                                                # launches, a device function a kernel calls)
