"""Analysis of a host-driven CUDA program with tree-sitter's CUDA grammar (no regular expressions over code).

It finds the NCCL calls (collectives, send/recv, group start/end) with their buffers, counts, types, ops,
communicators and streams; allocations (cudaMalloc vs ncclMemAlloc); kernel launches, cuBLAS calls and
memory copies with their streams; synchronisation (stream and device syncs, events); and the producer/consumer edges
between them, through the buffers they write and read, in program order within each function.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cuco.fastpath.places import Pointers, fixed_index, pointer_params
from cuco.fastpath.syntax import (
    TOO_DEEP,
    blank_macros,
    call_args,
    callee,
    function_name,
    is_zero_literal,
    parser,
    text,
    too_deep,
    walk,
)

# Argument names by position, from nccl.h (2.28).
NCCL_SIGNATURES: dict[str, tuple[str, ...]] = {
    "ncclAllGather": ("send", "recv", "count", "dtype", "comm", "stream"),
    "ncclReduceScatter": ("send", "recv", "count", "dtype", "op", "comm", "stream"),
    "ncclAllReduce": ("send", "recv", "count", "dtype", "op", "comm", "stream"),
    "ncclBroadcast": ("send", "recv", "count", "dtype", "root", "comm", "stream"),
    "ncclBcast": ("recv", "count", "dtype", "root", "comm", "stream"),  # in place: the root's buffer is sent
    "ncclReduce": ("send", "recv", "count", "dtype", "op", "root", "comm", "stream"),
    "ncclAlltoAll": ("send", "recv", "count", "dtype", "comm", "stream"),
    "ncclSend": ("send", "count", "dtype", "peer", "comm", "stream"),
    "ncclRecv": ("recv", "count", "dtype", "peer", "comm", "stream"),
    "ncclGroupStart": (),
    "ncclGroupEnd": (),
}
BLAS_STREAM = {"cublasLtMatmul": 15}  # a cuBLAS call that takes its stream (the others run on their handle's)
# C = alpha op(A) op(B) + beta C: (beta's position, C's). C is read too unless beta is zero.
GEMM_BETA: dict[str, tuple[int, int]] = {
    "cublasGemmEx": (13, 14), "cublasSgemm": (11, 12), "cublasHgemm": (11, 12), "cublasDgemm": (11, 12),
    "cublasLtMatmul": (7, 8), "cublasGemmStridedBatchedEx": (15, 16),
    **{f"cublas{t}gemmStridedBatched": (13, 14) for t in "SDH"}}
ALLOCATORS = {"cudaMalloc": "cudaMalloc", "cudaMallocAsync": "cudaMalloc", "ncclMemAlloc": "ncclMemAlloc",
              "cudaMallocManaged": "cudaMallocManaged"}
FREES = ("cudaFree", "cudaFreeAsync", "ncclMemFree")
# Calls that make a sub-communicator of the program's own, and the position of the one they make.
COMM_MAKERS = {"ncclCommSplit": 3, "ncclCommShrink": 4}
# Calls given a buffer that do no work on it: its address or attributes only.
NOT_WORK = frozenset({"cudaPointerGetAttributes", "cudaMemGetInfo", "cudaFuncSetAttribute", "printf", "fprintf",
                      "CUCO_CUDA", "CUCO_NCCL", "CUCO_CUBLAS", "static_cast", "reinterpret_cast", "sizeof"})
ENTRY_POINTS = ("cuco_setup", "cuco_run", "cuco_teardown")  # what the runner calls in a candidate (cuco.h)
# Memory copies and fills: (written position, read position or None, stream position or None).
COPIES: dict[str, tuple[int, int | None, int | None]] = {
    "cudaMemcpy": (0, 1, None), "cudaMemcpyAsync": (0, 1, 4), "cudaMemcpyPeerAsync": (0, 2, 5),
    "cudaMemset": (0, None, None), "cudaMemsetAsync": (0, None, 3),
    "cudaMemcpy2DAsync": (0, 2, 7), "cudaMemset2DAsync": (0, None, 5),
}
# Synchronisation calls and the position of their stream argument (None: no stream).
SYNCS: dict[str, int | None] = {"cudaStreamSynchronize": 0, "cudaDeviceSynchronize": None, "cudaEventRecord": 1,
                                "cudaStreamWaitEvent": 0, "cudaEventSynchronize": None}
# cuBLAS calls and where their matrices are: (read positions, written positions).
BLAS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "cublasGemmEx": ((7, 10), (14,)),
    "cublasSgemm": ((7, 9), (12,)),
    "cublasHgemm": ((7, 9), (12,)),
    "cublasDgemm": ((7, 9), (12,)),
    "cublasGemmStridedBatchedEx": ((7, 11), (16,)),
    **{f"cublas{t}gemmStridedBatched": ((7, 10), (14,)) for t in "SDH"},
    "cublasLtMatmul": ((3, 5), (10,)),  # D (10) = alpha A B + beta C (8)
    "cuco_gemm_bf16": ((1, 2), (3,)),
    "cuco_gemm_bf16_beta": ((1, 2, 3), (3,)),
    "cuco_gemm_bf16_accumulate": ((1, 2, 3), (3,)),
    "cuco_gemm_bf16_batched": ((1, 3), (4,)),
}


class AnalysisError(ValueError):
    pass


class NoCommunication(AnalysisError):
    """The program issues no NCCL call: nothing to co-design."""


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
    loops: list[int] = field(default_factory=list)  # lines of the loops around the call, outermost first
    # Where the statement holding the call starts, when that statement stands in a block (a statement may be put
    # before it there); -1 where it does not (the body of an unbraced `if`, a condition).
    statement: int = -1
    # Arguments in pointer positions that name no buffer the analysis knows ("?" for a kernel defined elsewhere,
    # whose pointer parameters are unknown): what such a call touches cannot be told.
    unplaced: list[str] = field(default_factory=list)
    # A cuBLAS call's arguments as written: what a GEMM cut by rows re-issues (cuco/fastpath/gemm_rows.py).
    operands: list[str] = field(default_factory=list)
    # An NCCL call whose result the program keeps or tests (`ncclResult_t r = ncclAllReduce(...)`), not a statement
    # of its own or the one argument of a check macro.
    valued: bool = False
    # The block the call's statement stands in (its first byte; -1 for none): a join placed in another block than
    # its collective's would not be on every path after it.
    block: int = -1
    deferred: bool = False  # in a lambda's body: it runs where the lambda is called, not where it is written


@dataclass
class Analysis:
    path: str
    ops: list[Op]
    edges: list[tuple[int, int, str]]  # producer op, consumer op, buffer
    buffers: dict[str, str]  # buffer -> allocator (or "workload" for cuco_buffer lookups)
    warnings: list[str]
    source: bytes = field(default=b"", repr=False)  # the text analysed: a rewrite edits these bytes, unparsed again
    # Per function, the integers it defines once (name -> the expression's text) and those it assigns again, in a
    # loop or later (name -> None): what a peer expression like `next` stands for, or that it cannot be known.
    scalars: dict[str, dict[str, str | None]] = field(default_factory=dict, repr=False)
    # Per function, where its local pointers point (buffer and byte offset), or why the rules cannot say.
    pointers: dict[str, Pointers] = field(default_factory=dict, repr=False)
    # Edges a loop carries from one iteration to the next: producer op, consumer op, buffer, the loop's line.
    carried: list[tuple[int, int, str, int]] = field(default_factory=list)
    # Per function, the byte where a statement may go last in its body: before its final top-level return, or
    # before its closing brace.
    ends: dict[str, int] = field(default_factory=dict, repr=False)
    # Per function, where its return statements start: one between a collective and its join ends the step early.
    returns: dict[str, list[int]] = field(default_factory=dict, repr=False)
    # Communicators the program makes itself (`ncclCommSplit(..., &s->tp)`: "s->tp") -> the call that makes it.
    made_comms: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def nccl(self) -> list[Op]:
        return [o for o in self.ops if o.kind in ("collective", "p2p", "group")]

    def to_json(self) -> str:
        return json.dumps({"path": self.path, "ops": [asdict(o) for o in self.ops], "edges": self.edges,
                           "carried": self.carried, "buffers": self.buffers, "warnings": self.warnings}, indent=1)


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
        self.handles: dict[str, str] = {}  # variable holding cuco_buffer(ctx, "x") -> "x"; its window is X->window
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
                        self.handles[text(ident)] = text(lit)
                    break
            else:
                if ident is not None:  # a pointer derived from a known buffer stays that buffer
                    src = self.buffer_of(value)
                    if src:
                        self.alias[text(ident)] = src

    def learn_field(self, node) -> None:
        """`c.x = (float*)cuco_buffer(ctx, "x")->ptr;`: a struct's field given a buffer is that buffer."""
        target, op = node.child_by_field_name("left"), node.child_by_field_name("operator")
        if target is not None and target.type == "field_expression" and op is not None and text(op) == "=":
            src = self.buffer_of(node.child_by_field_name("right"))
            if src:
                self.alias.setdefault(text(target).replace(" ", ""), src)

    def buffer_of(self, expr) -> str | None:
        for n in walk(expr):
            if n.type == "field_expression" and text(n).replace(" ", "") in self.allocated:  # s->buf
                return text(n).replace(" ", "")
            if n.type == "field_expression" and text(n).replace(" ", "") in self.alias:  # c.x, given a buffer
                return self.alias[text(n).replace(" ", "")]
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


def _parse(path: Path, raw: bytes) -> tuple[list, list[str]]:
    """The function definitions of the program and warnings for what the parser did not understand."""
    if b"\0" in raw:
        raise AnalysisError(f"{path}: not a text file")
    try:
        raw.decode()
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise AnalysisError(f"{path}:{line}: not UTF-8 (byte {raw[exc.start]:#04x}): save it as UTF-8") from None
    root = parser().parse(blank_macros(raw)).root_node
    deep = too_deep(root)
    if deep is not None:
        raise AnalysisError(f"{path}:{deep}: {TOO_DEEP}")
    functions = [n for n in walk(root) if n.type == "function_definition"]
    errors = [n for n in walk(root) if n.type == "ERROR" or n.is_missing]
    if not functions:
        where = f"; first syntax error at line {errors[0].start_point.row + 1}" if errors else ""
        raise AnalysisError(f"{path}: cannot parse as CUDA C++: no function definition found{where}")
    return functions, [f"line {e.start_point.row + 1}: the parser did not understand {text(e)[:60]!r}"
                       for e in errors[:5]]


def _parameters(fn) -> list:
    params = fn.child_by_field_name("declarator")
    while params is not None and params.type != "function_declarator":
        params = params.child_by_field_name("declarator")
    plist = params.child_by_field_name("parameters") if params is not None else None
    return plist.named_children if plist is not None else []


def const_params(functions: list) -> dict[str, list[bool]]:
    """Kernels defined here: which pointer parameters are const (read only); the others may be written."""
    return {function_name(fn): [p.type == "parameter_declaration" and "const" in
                                [text(c) for c in p.children if c.type == "type_qualifier"] for p in _parameters(fn)]
            for fn in functions}


def pointer_positions(functions: list) -> dict[str, list[bool]]:
    """Kernels defined here: which parameters are pointers (or arrays), the arguments that may name a buffer."""
    return {function_name(fn): [any(n.type in ("pointer_declarator", "array_declarator", "abstract_pointer_declarator")
                                    for n in walk(p)) for p in _parameters(fn)] for fn in functions}


def indirect_kernels(functions: list) -> set[str]:
    """Functions defined here that reach memory through pointers they are not given as arguments: a pointer to
    pointers (a table of buffers), a struct of the file's that holds pointers, a `__device__` pointer of the file,
    an address cast from a value it loads. What their arguments name is not all they touch."""
    root = functions[0] if functions else None
    while root is not None and root.parent is not None:
        root = root.parent
    device_ptrs = set()
    for d in (root.children if root is not None else []):
        if d.type == "declaration" and any(c.type == "__device__" or text(c) == "__device__" for c in d.children):
            device_ptrs |= {text(n) for x in d.children_by_field_name("declarator") for n in walk(x)
                            if n.type == "identifier" and x.type in ("pointer_declarator", "init_declarator")
                            and "*" in text(x)}
    holders = {text(n.child_by_field_name("name")) for n in walk(root) if root is not None  # structs of pointers
               and n.type in ("struct_specifier", "class_specifier") and n.child_by_field_name("name") is not None
               and any(f.type == "field_declaration" and "*" in text(f) for f in walk(n))}
    out = set()
    for fn in functions:
        params = _parameters(fn)
        deep = any(sum(n.type in ("pointer_declarator", "abstract_pointer_declarator") for n in walk(p)) > 1
                   or {text(n) for n in walk(p) if n.type == "type_identifier"} & holders for p in params)
        body = fn.child_by_field_name("body")
        names = {text(n) for n in walk(body) if n.type == "identifier"} if body is not None else set()
        if deep or device_ptrs & names or (body is not None and any(_made_pointer(n) for n in walk(body))):
            out.add(function_name(fn))
    return out


def _made_pointer(node) -> bool:
    """A cast to a pointer of a value loaded from memory (`(float*)table[1]`, `reinterpret_cast<T*>(p.x)`): an
    address the kernel was given as data."""
    if node.type == "cast_expression":
        typ, value = node.child_by_field_name("type"), node.child_by_field_name("value")
    elif node.type == "call_expression" and callee(node) in ("reinterpret_cast", "static_cast") and call_args(node):
        typ, value = node.child_by_field_name("function"), call_args(node)[0]
    else:
        return False
    while value is not None and value.type == "parenthesized_expression":
        value = value.named_children[0] if value.named_children else None
    loaded = value is not None and (value.type in ("subscript_expression", "field_expression") or (
        value.type == "pointer_expression" and text(value).startswith("*")))  # `&x[i]` is x's own address
    return typ is not None and "*" in text(typ) and loaded


def _statement_start(node) -> int:
    """The first byte of the statement holding NODE when that statement stands in a block, else -1."""
    kinds = ("expression_statement", "return_statement", "declaration")
    while node is not None and node.type not in kinds:
        if node.type in ("compound_statement", "function_definition"):
            return -1
        node = node.parent
    return node.start_byte if node is not None and node.parent is not None and \
        node.parent.type == "compound_statement" else -1


def _block(node) -> int:
    """The first byte of the block (compound statement) around NODE, or -1; a lambda's body is a block of its own."""
    node = node.parent
    while node is not None and node.type != "compound_statement":
        node = node.parent
    return node.start_byte if node is not None else -1


def _in_lambda(node) -> bool:
    node = node.parent
    while node is not None and node.type not in ("lambda_expression", "function_definition"):
        node = node.parent
    return node is not None and node.type == "lambda_expression"


def _returns(fn) -> list[int]:
    """Where the function's own return statements start (a lambda's return ends the lambda, not the function)."""
    return [n.start_byte for n in walk(fn) if n.type == "return_statement" and not _in_lambda(n)]


def _body_end(fn) -> int:
    """Where a statement goes last in a function's body: before its final top-level return, or its brace."""
    body = fn.child_by_field_name("body")
    if body is None:
        return -1
    last = next((n for n in reversed(body.named_children) if n.type != "comment"), None)
    return last.start_byte if last is not None and last.type == "return_statement" else body.end_byte - 1


class _Calls:
    """Turns each call of one program into an Op, in program order, remembering what later calls need."""

    def __init__(self, functions: list) -> None:
        self.res = _Resolver()
        self.ops: list[Op] = []
        self.const = const_params(functions)
        self.pointers = pointer_positions(functions)
        self.indirect = indirect_kernels(functions)
        self.device = {function_name(f) for f in functions  # kernels and device functions: no host calls in them
                       if any(c.type in ("__global__", "__device__") for c in f.children)}
        self.blas_streams: dict[str, str] = {}
        self.made_comms: dict[str, str] = {}  # communicators the program makes itself -> the call that makes it
        self.scalars: dict[str, dict[str, str | None]] = {}
        self.warnings: list[str] = []

    def add(self, kind: str, name: str, node, fname: str, args: dict[str, str], reads: list[str] | None = None,
            writes: list[str] | None = None, stream: str | None = None, span=None, wrapper=None,
            unplaced: list[str] | None = None) -> None:
        self.ops.append(Op(len(self.ops), kind, name, node.start_point.row + 1, fname, args, reads or [],
                           writes or [], stream, span or (0, 0), wrapper, _loops(node), _statement_start(node),
                           unplaced or [], block=_block(node), deferred=_in_lambda(node)))

    def unplaced(self, args: list, positions) -> list[str]:
        """The arguments at POSITIONS that name no known buffer."""
        return [text(args[i]) for i in positions if i is not None and i < len(args) and not self.res.buffer_of(args[i])]

    def buffers(self, args: list, positions) -> list[str]:
        out = []
        for i in positions:
            b = self.res.buffer_of(args[i]) if i is not None and i < len(args) else None
            if b:
                out.append(b)
                if any(n.type == "subscript_expression" and fixed_index(n) is None for n in walk(args[i])):
                    self.warnings.append(f"line {args[i].start_point.row + 1}: `{text(args[i])}` picks one of several "
                                         f"buffers at run time; this table names them all `{b}`")
        return out

    def function(self, fn) -> None:
        fname = function_name(fn)
        self.res.pointer_params = pointer_params(fn)
        scalars = self.scalars.setdefault(fname, {})
        first = len(self.ops)
        for node in walk(fn):
            if node.type == "declaration":
                self.res.learn_declaration(node)
            elif node.type == "assignment_expression":
                self.res.learn_field(node)
                right = node.child_by_field_name("right")  # `g_comm = s->tp;`: the split communicator too
                made = self.made_comms.get(text(right).replace(" ", "")) if right is not None else None
                if made:
                    self.made_comms[text(node.child_by_field_name("left")).replace(" ", "")] = made
            _learn_scalars(node, scalars)
            fn, arg_list = node.child_by_field_name("function"), node.child_by_field_name("arguments")
            if node.type == "call_expression" and fn is not None and arg_list is not None:  # `k<float>` is k
                args = [a for a in arg_list.named_children if a.type != "comment"]
                self.call(node, callee(node), args, fname)
        # Streams and handles by what they hold: `cudaStream_t stream = ctx->stream;` is ctx->stream (a variable
        # given one value in the whole function: _learn_scalars forgets one assigned again), so calls on either
        # name are on one stream. A GEMM's stream is its handle's (cublasSetStream).
        for op in self.ops[first:]:
            if op.kind == "blas":
                op.stream = _held(op.args["stream"], scalars) if "stream" in op.args else \
                    self.blas_streams.get(_held(op.args["handle"], scalars))
            elif op.stream:
                op.stream = _held(op.stream, scalars)

    def call(self, node, name: str, args: list, fname: str) -> None:
        launch = next((c for c in node.children if c.type == "kernel_call_syntax"), None)
        if launch is not None:
            self.launch(node, name, args, fname, [text(a) for a in launch.named_children])
        elif name in NCCL_SIGNATURES:
            sig = NCCL_SIGNATURES[name]
            named = {k: text(a) for k, a in zip(sig, args)}
            kind = "group" if not sig else "p2p" if name in ("ncclSend", "ncclRecv") else "collective"
            span, wrapper = _statement(node)
            self.add(kind, name, node, fname, named, self.buffers(args, [sig.index("send")] if "send" in named else []),
                     self.buffers(args, [sig.index("recv")] if "recv" in named else []), named.get("stream"),
                     span, wrapper)
            held = node.parent.parent if wrapper else node  # the call, or the check macro around it
            self.ops[-1].valued = held.parent is None or held.parent.type != "expression_statement"
        elif name in ALLOCATORS and args:
            # The pointer allocated: `&p`, `(void**)&s->p`: the outermost variable or field under the casts.
            target = next((n for n in walk(args[0]) if n.type in ("field_expression", "identifier")), None)
            if target is not None:
                key = text(target).replace(" ", "")
                # A field is the buffer itself: `&s->p` allocates s->p, not the s a helper was passed.
                buf = key if target.type == "field_expression" else self.res.buffer_of(args[0]) or key
                self.res.allocated[key] = ALLOCATORS[name]
                self.add("alloc", name, node, fname, {"buffer": buf, "bytes": text(args[1]) if len(args) > 1 else "?"},
                         span=(node.start_byte, node.end_byte))
        elif name in FREES and args:
            buf = self.res.buffer_of(args[0]) or text(args[0]).replace(" ", "")
            self.add("free", name, node, fname, {"buffer": buf}, span=(node.start_byte, node.end_byte))
        elif name == "cublasSetStream" and len(args) == 2:
            scalars = self.scalars.get(fname, {})
            self.blas_streams[_held(text(args[0]), scalars)] = _held(text(args[1]), scalars)
        else:
            self.library_call(node, name, args, fname)

    def launch(self, node, name: str, args: list, fname: str, cfg: list[str]) -> None:
        consts = self.const.get(name, [])
        reads, writes = [], []
        for i, a in enumerate(args):
            b = self.res.buffer_of(a)
            if b:
                reads.append(b)
                if not (i < len(consts) and consts[i]):  # unknown kernels: assume written too
                    writes.append(b)
        pointers = self.pointers.get(name)
        unplaced = ["?"] if pointers is None else ["*"] if name in self.indirect else \
            self.unplaced(args, [i for i, p in enumerate(pointers) if p])
        self.add("kernel", name, node, fname, {"config": ", ".join(cfg)}, reads, writes,
                 cfg[3] if len(cfg) > 3 else "default stream", unplaced=unplaced)
        self.ops[-1].operands = [text(a) for a in args]

    def library_call(self, node, name: str, args: list, fname: str) -> None:
        if name in BLAS:
            rpos, wpos = BLAS[name]
            beta, c = GEMM_BETA.get(name, (None, None))
            if beta is not None and beta < len(args) and not zero_scalar(text(args[beta]), self.scalars.get(fname, {})):
                rpos += (c,)
            handle = text(args[0]) if args else ""
            named = {"handle": handle}
            if name in BLAS_STREAM and BLAS_STREAM[name] < len(args):  # a call that takes its stream itself
                named["stream"] = text(args[BLAS_STREAM[name]])
            self.add("blas", name, node, fname, named, self.buffers(args, rpos), self.buffers(args, wpos),
                     None, span=(node.start_byte, node.end_byte),
                     unplaced=self.unplaced(args, rpos + wpos))
            self.ops[-1].operands = [text(a) for a in args]
        elif name in COPIES:
            wpos, rpos, spos = COPIES[name]
            self.add("copy", name, node, fname, {"bytes": text(args[2]) if len(args) > 2 else "?"},
                     self.buffers(args, [rpos]), self.buffers(args, [wpos]),
                     text(args[spos]) if spos is not None and spos < len(args) else None,
                     unplaced=self.unplaced(args, [rpos, wpos]))
        elif name in COMM_MAKERS and COMM_MAKERS[name] < len(args):
            made = text(args[COMM_MAKERS[name]]).replace(" ", "").removeprefix("&")
            self.made_comms[made] = f"{name} (line {node.start_point.row + 1})"
        elif name in SYNCS:
            pos = SYNCS[name]
            self.add("sync", name, node, fname, {"args": ", ".join(text(a) for a in args)},
                     stream=text(args[pos]) if pos is not None and pos < len(args) else None)
        elif name not in NOT_WORK and not name.startswith("cuco_") and not name.isupper() and \
                fname not in self.device:  # not a check macro, nor a call in device code
            # A call the rules do not model (cudaMemcpy2DAsync, a library's kernel, the program's own function)
            # given a buffer: it may read and write it, on a stream not known.
            touched = [b for a in args if a.type != "call_expression" and (b := self.res.buffer_of(a))]
            if touched:
                self.add("opaque", name, node, fname, {"args": ", ".join(text(a) for a in args)}, touched, touched)


def _held(expr: str, scalars: dict[str, str | None]) -> str:
    """What a variable of one value holds, followed through variables of one value (`stream` -> `ctx->stream`)."""
    seen = set()
    while scalars.get(expr) and expr not in seen:
        seen.add(expr)
        expr = str(scalars[expr])
    return expr


def zero_scalar(expr: str, scalars: dict[str, str | None]) -> bool:
    """A GEMM's beta is zero: `0.0f`, or `&beta` (`beta`) of a local defined once as one."""
    name = expr.strip().removeprefix("&").strip()
    return is_zero_literal(scalars.get(name) or name)


def _learn_scalars(node, scalars: dict[str, str | None]) -> None:
    """Plain variables defined once with a value keep it; declared without one, assigned again, incremented, or
    declared in a loop's header, they have none the rules can use."""
    if node.type == "declaration":
        in_loop_header = node.parent is not None and node.parent.type == "for_statement"
        for d in node.named_children:
            name = d.child_by_field_name("declarator") if d.type == "init_declarator" else d
            if name is None or name.type != "identifier":
                continue  # pointers, arrays, functions: not integers a peer could be
            value = d.child_by_field_name("value") if d.type == "init_declarator" else None
            known = text(name) not in scalars and value is not None and not in_loop_header
            scalars[text(name)] = text(value) if known else None
    elif node.type in ("assignment_expression", "update_expression"):
        target = node.child_by_field_name("left") or node.child_by_field_name("argument")
        if target is not None and target.type == "identifier":
            scalars[text(target)] = None
    elif node.type == "pointer_expression" and text(node).startswith("&") and not _scalar_of_blas(node):
        target = node.child_by_field_name("argument")
        if target is not None and target.type == "identifier":
            scalars[text(target)] = None  # written through its address (ncclCommCount(comm, &n))


def _scalar_of_blas(node) -> bool:
    """`&alpha`, `&beta` handed to a cuBLAS call: read by it, not written (cuBLAS takes its scalars by address)."""
    args = node.parent
    return args is not None and args.type == "argument_list" and callee(args.parent).startswith("cublas")


LOOPS = ("for_statement", "while_statement", "do_statement", "for_range_loop")


def _loops(node) -> list[int]:
    lines = []
    while node is not None and node.type != "function_definition":
        if node.type in LOOPS:
            lines.append(node.start_point.row + 1)
        node = node.parent
    return lines[::-1]


def _carried(ops: list[Op]) -> list[tuple[int, int, str, int]]:
    """Edges from one iteration of a loop to the next: an op of the loop that reads a buffer no earlier op of the
    loop's body wrote reads what the body's last writer of it left in the previous iteration."""
    out = []
    for fname, line in dict.fromkeys((o.function, ln) for o in ops for ln in o.loops):
        body = [o for o in ops if o.function == fname and line in o.loops]
        for o in body:
            for b in o.reads:
                writers = [w for w in body if b in w.writes]
                if writers and not any(w.index < o.index for w in writers):
                    out.append((writers[-1].index, o.index, b, line))
    return out


def _edges(ops: list[Op]) -> list[tuple[int, int, str]]:
    """Producer -> consumer through a buffer: the last op that wrote it before an op that reads it, per function."""
    edges = []
    for fname in dict.fromkeys(o.function for o in ops):
        last_writer: dict[str, int] = {}
        for o in (o for o in ops if o.function == fname):
            for b in o.reads:
                if b in last_writer and last_writer[b] != o.index:
                    edges.append((last_writer[b], o.index, b))
            for b in o.writes:
                last_writer[b] = o.index
    return edges


def _unsure_pointers(ops: list[Op], pointers: dict[str, Pointers]) -> list[str]:
    """Pointers the calls use that are assigned again: the table names the buffer of their first definition."""
    out = []
    for fname, ptrs in pointers.items():
        used = " ".join(v for o in ops if o.function == fname for v in [*o.args.values(), *o.operands])
        out += [f"{why}: this table names the buffer of its first definition"
                for name, why in ptrs.reassigned.items() if re.search(rf"\b{name}\b", used)]
    return out


def _reachable(functions: list) -> list:
    """A candidate's functions that its entry points reach, by any name they use (a call, a launch, a method, a
    function handed on); a program without cuco_run keeps them all. A method of a kept class that nothing calls is
    no part of what the runner runs."""
    by_name: dict[str, list] = {}
    for fn in functions:
        by_name.setdefault(function_name(fn).split("::")[-1], []).append(fn)
    if "cuco_run" not in by_name:
        return functions
    todo = [fn for name in ENTRY_POINTS for fn in by_name.get(name, [])]
    seen: set[int] = set()
    while todo:
        fn = todo.pop()
        if fn.id in seen:
            continue
        seen.add(fn.id)
        todo += [f for n in walk(fn) if n.type in ("identifier", "field_identifier") for f in by_name.get(text(n), [])]
    return [fn for fn in functions if fn.id in seen]


def analyze(path: Path, source: bytes | None = None) -> Analysis:
    raw = source if source is not None else Path(path).read_bytes()
    functions, warnings = _parse(path, raw)
    functions = _reachable(functions)
    calls = _Calls(functions)
    for fn in functions:
        calls.function(fn)
    buffers = {**{v: "workload" for v in calls.res.alias.values()}, **calls.res.allocated}
    # After every function is read: a buffer allocated in setup is known where run uses it.
    pointers = {function_name(fn): Pointers(fn, calls.res.handles, set(calls.res.allocated),
                                            calls.scalars.get(function_name(fn), {})) for fn in functions}
    warnings += calls.warnings + _unsure_pointers(calls.ops, pointers)
    analysis = Analysis(str(path), calls.ops, _edges(calls.ops), buffers, warnings, raw, calls.scalars, pointers,
                        _carried(calls.ops), {function_name(fn): _body_end(fn) for fn in functions},
                        {function_name(fn): _returns(fn) for fn in functions}, calls.made_comms)
    if not analysis.nccl:
        raise NoCommunication(f"{path}: no NCCL call found: nothing to move onto the GPU (cuco starts from a program "
                              "whose communication is host-issued NCCL)")
    return analysis
