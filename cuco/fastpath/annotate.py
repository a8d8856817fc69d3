"""Evolve-block annotation: what the slow path may change, and what stays frozen.

Kernels, device helpers and the state struct become evolve blocks whole; the entry points keep their
signatures (the harness calls them) and get their bodies marked. Includes, the requirements hook, the
statements that allocate and release the symmetric windows the device collectives use, and anything else
the harness relies on stay outside. A program that already has evolve blocks is left as it is.
"""

from __future__ import annotations

from cuco.fastpath.syntax import blank_macros, function_name, parser, text
from cuco.program.blocks import EVOLVE_END, EVOLVE_START

ENTRY_POINTS = ("cuco_setup", "cuco_run", "cuco_teardown")
FROZEN = ("cuco_dev_requirements",)
# Statements inside entry points that stay frozen: a window every rank must register and release alike.
FROZEN_CALLS = ("cuco::symmetricAlloc", "cuco::symmetricFree")


def annotate(code: str) -> str:
    if EVOLVE_START in code:
        return code
    src = code.encode()
    root = parser().parse(blank_macros(src)).root_node
    inserts: list[tuple[int, str]] = []  # (byte offset, text), applied from the end
    for node in root.children:
        target = node
        if node.type in ("template_declaration",):
            target = next((c for c in node.children if c.type == "function_definition"), node)
        if target.type == "function_definition":
            name = function_name(target)
            if name in FROZEN:
                continue
            if name in ENTRY_POINTS:
                body = target.child_by_field_name("body")
                if body is None or body.named_child_count == 0:
                    continue
                # Inside the braces, each marker on a line of its own: the signature stays frozen even
                # when the whole function is written on one line.
                inserts += [(body.start_byte + 1, f"\n  // {EVOLVE_START}\n"),
                            (body.end_byte - 1, f"\n  // {EVOLVE_END}\n")]
                for stmt in body.named_children:  # frozen statements split the body's block around them
                    if any(call in text(stmt) for call in FROZEN_CALLS):
                        inserts += [(_line_start(src, stmt.start_byte), f"  // {EVOLVE_END}\n"),
                                    (_line_end(src, stmt.end_byte), f"\n  // {EVOLVE_START}")]
                continue
        if node.type in ("function_definition", "template_declaration", "struct_specifier") or (
                node.type == "declaration" and any(c.type == "struct_specifier" for c in node.children)):
            inserts += [(_line_start(src, node.start_byte), f"// {EVOLVE_START}\n"),
                        (_line_end(src, node.end_byte), f"\n// {EVOLVE_END}")]
    for offset, insert in sorted(inserts, key=lambda t: -t[0]):
        src = src[:offset] + insert.encode() + src[offset:]
    return src.decode()


def _line_start(src: bytes, offset: int) -> int:
    return src.rfind(b"\n", 0, offset) + 1


def _line_end(src: bytes, offset: int) -> int:
    end = src.find(b"\n", offset)
    return len(src) if end < 0 else end
