"""Analysis of a host-driven CUDA program with tree-sitter's CUDA grammar (no regular expressions over code).

It finds the NCCL calls (collectives, send/recv, group start/end) with their buffers, counts, types, ops,
communicators and streams; allocations (cudaMalloc vs ncclMemAlloc); kernel launches, cuBLAS calls and
memory copies with their streams; synchronisation (stream and device syncs, events); and the producer/consumer edges between
them, through the buffers they write and read, in program order within each function.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cuco.fastpath.syntax import blank_macros, function_name, parser, text, walk

# Argument names by position, from nccl.h (2.28).
NCCL_SIGNATURES: dict[str, tuple[str, ...]] = {
    "ncclAllGather": ("send", "recv", "count", "dtype", "comm", "stream"),
    "ncclReduceScatter": ("send", "recv", "count", "dtype", "op", "comm", "stream"),
    "ncclAllReduce": ("send", "recv", "count", "dtype", "op", "comm", "stream"),
    "ncclBroadcast": ("send", "recv", "count", "dtype", "root", "comm", "stream"),
    "ncclReduce": ("send", "recv", "count", "dtype", "op", "root", "comm", "stream"),
    "ncclAlltoAll": ("send", "recv", "count", "dtype", "comm", "stream"),
    "ncclSend": ("send", "count", "dtype", "peer", "comm", "stream"),
    "ncclRecv": ("recv", "count", "dtype", "peer", "comm", "stream"),
    "ncclGroupStart": (),
    "ncclGroupEnd": (),
}
ALLOCATORS = {"cudaMalloc": "cudaMalloc", "cudaMallocAsync": "cudaMalloc", "ncclMemAlloc": "ncclMemAlloc",
              "cudaMallocManaged": "cudaMallocManaged"}
FREES = ("cudaFree", "cudaFreeAsync", "ncclMemFree")
# Memory copies and fills: (written position, read position or None, stream position or None).
COPIES: dict[str, tuple[int, int | None, int | None]] = {
    "cudaMemcpy": (0, 1, None), "cudaMemcpyAsync": (0, 1, 4), "cudaMemcpyPeerAsync": (0, 2, 5),
    "cudaMemset": (0, None, None), "cudaMemsetAsync": (0, None, 3),
}
# Synchronisation calls and the position of their stream argument (None: no stream).
SYNCS: dict[str, int | None] = {"cudaStreamSynchronize": 0, "cudaDeviceSynchronize": None, "cudaEventRecord": 1,
                                "cudaStreamWaitEvent": 0, "cudaEventSynchronize": None}
# cuBLAS calls and where their matrices are: (read positions, written positions, stream position or None).
BLAS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "cublasGemmEx": ((7, 10), (14,)),
    "cublasSgemm": ((7, 9), (12,)),
    "cublasHgemm": ((7, 9), (12,)),
    "cublasLtMatmul": ((3, 5), (8,)),
    "cuco_gemm_bf16": ((1, 2), (3,)),
}
# The candidate contract's context (cuco.h): a pointer parameter, but not a buffer.
CONTEXT_TYPE = "cuco_ctx_t"


class AnalysisError(ValueError):
    pass


@dataclass
class Op:
    index: int
    kind: str  # collective | p2p | group | alloc | free | kernel | blas | copy | sync
    name: str
    line: int
    function: str
    args: dict[str, str] = field(default_factory=dict)
    reads: list[str] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)
    stream: str | None = None
    span: tuple[int, int] = (0, 0)  # bytes of the call; for NCCL calls with the check macro around it, if any
    wrapper: str | None = None  # that check macro (CUCO_NCCL, NCCLCHECK, ...)


@dataclass
class Analysis:
    path: str
    ops: list[Op]
    edges: list[tuple[int, int, str]]  # producer op, consumer op, buffer
    buffers: dict[str, str]  # buffer -> allocator (or "workload" for cuco_buffer lookups)
    warnings: list[str]

    @property
    def nccl(self) -> list[Op]:
        return [o for o in self.ops if o.kind in ("collective", "p2p", "group")]

    def to_json(self) -> str:
        return json.dumps({"path": self.path, "ops": [asdict(o) for o in self.ops], "edges": self.edges,
                           "buffers": self.buffers, "warnings": self.warnings}, indent=1)


def _statement(call) -> tuple[tuple[int, int], str | None]:
    """The bytes a rewrite replaces for a call: the call, or the check macro around it (CUCO_NCCL(ctx, ...),
    NCCLCHECK(...)), and that macro's name."""
    parent = call.parent
    if parent is not None and parent.type == "argument_list" and parent.parent is not None:
        wrap_fn = parent.parent.child_by_field_name("function")
        if wrap_fn is not None and text(wrap_fn).isupper():
            return (parent.parent.start_byte, parent.parent.end_byte), text(wrap_fn)
    return (call.start_byte, call.end_byte), None


class _Resolver:
    """Maps expressions to buffer names: variables bound to cuco_buffer(ctx, "x") or allocated by a call."""

    def __init__(self) -> None:
        self.alias: dict[str, str] = {}
        self.allocated: dict[str, str] = {}
        self.pointer_params: set[str] = set()  # of the function being read: buffers passed in by the caller

    def learn_declaration(self, node) -> None:
        for d in (c for c in walk(node) if c.type == "init_declarator"):
            target = d.child_by_field_name("declarator")
            value = d.child_by_field_name("value")
            if target is None or value is None:
                continue
            ident = next((n for n in walk(target) if n.type == "identifier"), None)
            for call in (n for n in walk(value) if n.type == "call_expression"):
                fn = call.child_by_field_name("function")
                if fn is not None and text(fn) == "cuco_buffer":
                    lit = next((n for n in walk(call) if n.type == "string_content"), None)
                    if ident is not None and lit is not None:
                        self.alias[text(ident)] = text(lit)
                    break
            else:
                if ident is not None:  # a pointer derived from a known buffer stays that buffer
                    src = self.buffer_of(value)
                    if src:
                        self.alias[text(ident)] = src

    def buffer_of(self, expr) -> str | None:
        for n in walk(expr):
            if n.type == "field_expression" and text(n).replace(" ", "") in self.allocated:  # s->buf
                return text(n).replace(" ", "")
            if n.type == "call_expression":
                fn = n.child_by_field_name("function")
                if fn is not None and text(fn) == "cuco_buffer":
                    lit = next((m for m in walk(n) if m.type == "string_content"), None)
                    return text(lit) if lit is not None else None
            if n.type == "identifier":
                name = text(n)
                if name in self.alias:
                    return self.alias[name]
                if name in self.allocated or name in self.pointer_params:
                    return name
        return None


def analyze(path: Path, source: bytes | None = None) -> Analysis:
    raw = source if source is not None else Path(path).read_bytes()
    if b"\0" in raw:
        raise AnalysisError(f"{path}: not a text file")
    tree = parser().parse(blank_macros(raw))
    root = tree.root_node
    functions = [n for n in walk(root) if n.type == "function_definition"]
    errors = [n for n in walk(root) if n.type == "ERROR" or n.is_missing]
    if not functions:
        where = f"; first syntax error at line {errors[0].start_point.row + 1}" if errors else ""
        raise AnalysisError(f"{path}: cannot parse as CUDA C++: no function definition found{where}")
    warnings = [f"line {e.start_point.row + 1}: the parser did not understand {text(e)[:60]!r}" for e in errors[:5]]
    res = _Resolver()
    ops: list[Op] = []
    # Kernels defined here: which pointer parameters are const (read only); the others may be written.
    kernel_const: dict[str, list[bool]] = {}
    for fn in functions:
        params = fn.child_by_field_name("declarator")
        while params is not None and params.type != "function_declarator":
            params = params.child_by_field_name("declarator")
        plist = params.child_by_field_name("parameters") if params is not None else None
        if plist is not None:
            kernel_const[function_name(fn)] = [p.type == "parameter_declaration" and "const" in
                                                [text(c) for c in p.children if c.type == "type_qualifier"]
                                                for p in plist.named_children]
    blas_streams: dict[str, str] = {}
    for fn in functions:
        fname = function_name(fn)
        res.pointer_params = {text(i) for p in walk(fn.child_by_field_name("declarator"))
                              if p.type == "parameter_declaration" and CONTEXT_TYPE not in text(p)
                              for d in [p.child_by_field_name("declarator")] if d is not None and d.type ==
                              "pointer_declarator" for i in walk(d) if i.type == "identifier"}
        for node in walk(fn):
            if node.type == "declaration":
                res.learn_declaration(node)
            if node.type != "call_expression":
                continue
            callee = node.child_by_field_name("function")
            arg_list = node.child_by_field_name("arguments")
            if callee is None or arg_list is None:
                continue
            name = text(callee)
            args = [a for a in arg_list.named_children if a.type != "comment"]
            line = node.start_point.row + 1
            launch = next((c for c in node.children if c.type == "kernel_call_syntax"), None)
            if launch is not None:
                cfg = [text(a) for a in launch.named_children]
                consts = kernel_const.get(name, [])
                reads, writes = [], []
                for i, a in enumerate(args):
                    b = res.buffer_of(a)
                    if b:
                        reads.append(b)
                        if not (i < len(consts) and consts[i]):  # unknown kernels: assume written too
                            writes.append(b)
                ops.append(Op(len(ops), "kernel", name, line, fname, {"config": ", ".join(cfg)}, reads, writes,
                              cfg[3] if len(cfg) > 3 else "default stream"))
            elif name in NCCL_SIGNATURES:
                sig = NCCL_SIGNATURES[name]
                named = {k: text(a) for k, a in zip(sig, args)}
                kind = "group" if not sig else "p2p" if name in ("ncclSend", "ncclRecv") else "collective"
                reads = [b for k in ("send",) if k in named for b in [res.buffer_of(args[sig.index(k)])] if b]
                writes = [b for k in ("recv",) if k in named for b in [res.buffer_of(args[sig.index(k)])] if b]
                ops.append(Op(len(ops), kind, name, line, fname, named, reads, writes, named.get("stream"),
                              *_statement(node)))
            elif name in ALLOCATORS and args:
                # The pointer allocated: `&p`, `(void**)&s->p`: the outermost variable or field under the casts.
                target = next((n for n in walk(args[0]) if n.type in ("field_expression", "identifier")), None)
                if target is not None:
                    key = text(target).replace(" ", "")
                    buf = res.buffer_of(args[0]) or key
                    res.allocated[key] = ALLOCATORS[name]
                    ops.append(Op(len(ops), "alloc", name, line, fname,
                                  {"buffer": buf, "bytes": text(args[1]) if len(args) > 1 else "?"},
                                  span=(node.start_byte, node.end_byte)))
            elif name in FREES and args:
                buf = res.buffer_of(args[0]) or text(args[0]).replace(" ", "")
                ops.append(Op(len(ops), "free", name, line, fname, {"buffer": buf},
                              span=(node.start_byte, node.end_byte)))
            elif name == "cublasSetStream" and len(args) == 2:
                blas_streams[text(args[0])] = text(args[1])
            elif name in BLAS:
                rpos, wpos = BLAS[name]
                reads = [b for i in rpos if i < len(args) for b in [res.buffer_of(args[i])] if b]
                writes = [b for i in wpos if i < len(args) for b in [res.buffer_of(args[i])] if b]
                handle = text(args[0]) if args else ""
                ops.append(Op(len(ops), "blas", name, line, fname, {"handle": handle}, reads, writes,
                              blas_streams.get(handle)))
            elif name in COPIES:
                wpos, rpos, spos = COPIES[name]
                writes = [b for b in [res.buffer_of(args[wpos])] if b] if wpos < len(args) else []
                reads = [b for b in [res.buffer_of(args[rpos])] if b] if rpos is not None and rpos < len(args) else []
                ops.append(Op(len(ops), "copy", name, line, fname, {"bytes": text(args[2]) if len(args) > 2 else "?"},
                              reads, writes, text(args[spos]) if spos is not None and spos < len(args) else None))
            elif name in SYNCS:
                pos = SYNCS[name]
                ops.append(Op(len(ops), "sync", name, line, fname, {"args": ", ".join(text(a) for a in args)},
                              stream=text(args[pos]) if pos is not None and pos < len(args) else None))
    buffers = {**{v: "workload" for v in res.alias.values()}, **res.allocated}
    edges = []
    for fname in dict.fromkeys(o.function for o in ops):
        last_writer: dict[str, int] = {}
        for o in (o for o in ops if o.function == fname):
            for b in o.reads:
                if b in last_writer and last_writer[b] != o.index:
                    edges.append((last_writer[b], o.index, b))
            for b in o.writes:
                last_writer[b] = o.index
    analysis = Analysis(str(path), ops, edges, buffers, warnings)
    if not analysis.nccl:
        raise AnalysisError(f"{path}: no NCCL call found: nothing to move onto the GPU (cuco transform starts from "
                            "a program whose communication is host-issued NCCL)")
    return analysis
