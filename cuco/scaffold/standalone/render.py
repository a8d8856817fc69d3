"""The program's text as the seed writes it: cuco's check macros, work moved onto ctx->stream, names bound to
the runner's objects, left-out statements gone, continuation lines kept in place."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cuco.fastpath.analyze import COPIES, NCCL_SIGNATURES
from cuco.fastpath.syntax import call_args, callee, text
from cuco.scaffold.standalone.calls import CHECKS, DEFAULT_STREAMS
from cuco.scaffold.standalone.nodes import calls_in, is_launch
from cuco.scaffold.standalone.program import Standalone

if TYPE_CHECKING:
    from cuco.scaffold.standalone.step import Step

CHECK_MACROS = (("cublas", "CUCO_CUBLAS"), ("nccl", "CUCO_NCCL"), ("cuda", "CUCO_CUDA"))


def _check_macro(name: str) -> str | None:
    return next((macro for prefix, macro in CHECK_MACROS if name.startswith(prefix)), None)


def _is_body(node) -> bool:
    parent = node.parent
    if parent is None:
        return False
    if parent.type == "else_clause":
        return True
    return any((c := parent.child_by_field_name(f)) is not None and c.id == node.id for f in ("body", "consequence"))


def _stream_position(name: str) -> int | None:
    if name in NCCL_SIGNATURES and "stream" in NCCL_SIGNATURES[name]:
        return NCCL_SIGNATURES[name].index("stream")
    return COPIES[name][2] if name in COPIES else None


class Render:
    """The program's text as the seed writes it: its check macros made cuco's (CUCO_CUDA(ctx, ...)), unchecked
    calls checked, work on the default stream moved onto ctx->stream, names renamed, left-out statements gone."""

    def __init__(self, prog: Standalone, dropped: set[int] | None = None, rename: dict[str, str] | None = None) -> None:
        self.prog = prog
        self.dropped = dropped or set()
        self.rename = rename or {}

    def __call__(self, node) -> str:
        if node.id in self.dropped:
            return "{}" if _is_body(node) else ""
        if node.type == "identifier" and text(node) in self.rename:
            return self.rename[text(node)]
        if node.type == "expression_statement":
            call = next((c for c in node.named_children if c.type != "comment"), None)
            macro = _check_macro(callee(call)) if call is not None and call.type == "call_expression" else None
            if macro is not None and not is_launch(call) and callee(call) not in self.prog.wrappers:  # ncclErrchk
                return f"{macro}(ctx, {self.call(call)});"
        if node.type == "call_expression":
            return self.call(node)
        return self.children(node)

    def children(self, node) -> str:
        out, pos = [], node.start_byte
        for c in node.children:
            out += [self.prog.src[pos:c.start_byte].decode(errors="replace"), self(c)]
            pos = c.end_byte
        out.append(self.prog.src[pos:node.end_byte].decode(errors="replace"))
        return "".join(out)

    def call(self, node) -> str:
        name, args = callee(node), call_args(node)
        if name in self.prog.wrappers and len(args) == 1 and args[0].type == "call_expression":
            inner = self.prog.unwrap(node)
            macro = _check_macro(callee(inner))
            return f"{macro}(ctx, {self.call(inner)})" if macro else self.call(inner)
        if is_launch(node):
            return self.launch(node)
        if name in ("cudaMemcpy", "cudaMemset"):
            return f"{name}Async({', '.join(self(a) for a in args)}, ctx->stream)"
        pos = _stream_position(name)
        if pos is not None and pos < len(args) and text(args[pos]) in DEFAULT_STREAMS:
            rendered = ["ctx->stream" if i == pos else self(a) for i, a in enumerate(args)]
            return f"{self(node.child_by_field_name('function'))}({', '.join(rendered)})"
        return self.children(node)

    def launch(self, node) -> str:
        syntax = next(c for c in node.children if c.type == "kernel_call_syntax")
        config = [c for c in syntax.named_children if c.type != "comment"]
        if len(config) >= 4 and text(config[3]) not in DEFAULT_STREAMS:
            return self.children(node)
        parts = [self(c) for c in config[:3]] + ["0"] * max(0, 3 - len(config))
        return (f"{self(node.child_by_field_name('function'))}<<<{', '.join(parts)}, ctx->stream>>>"
                f"{self(node.child_by_field_name('arguments'))}")

    def statement(self, node, indent: str = "  ") -> list[str]:
        """A statement's lines, re-indented: its continuation lines keep their place relative to its first, moved
        as far as a check macro moved the call they continue."""
        lines = self(node).split("\n")
        column = node.start_point.column
        body = [lines[0].strip()] + [ln[min(column, len(ln) - len(ln.lstrip(" "))):].rstrip() for ln in lines[1:]]
        before = text(node).split("\n")[0].strip()
        call = next(iter(calls_in(node)), None)
        name = callee(self.prog.unwrap(call)) + "(" if call is not None else "("
        shift = body[0].find(name) - before.find(name) if name in body[0] and name in before else 0
        moved = [body[0]] + [(" " * shift + ln) if shift > 0 else ln[min(-shift, len(ln) - len(ln.lstrip())):]
                             for ln in body[1:]]
        return [indent + ln for ln in moved if ln.strip()]


def step_lines(prog: Standalone, step: Step, kept: list) -> list[str]:
    """The step's kept statements as cuco_run's body; a kernel launch is followed by a check of its launch."""
    render = Render(prog, step.dropped)
    lines: list[str] = []
    for i, st in enumerate(kept):
        lines += render.statement(st)
        call = next((c for c in st.named_children if c.type == "call_expression"), None)
        after = kept[i + 1] if i + 1 < len(kept) else None
        if st.type == "expression_statement" and call is not None and is_launch(call) and not (
                after is not None and any(callee(c) in CHECKS for c in calls_in(after))):
            lines.append("  CUCO_CUDA(ctx, cudaGetLastError());")
    return lines
