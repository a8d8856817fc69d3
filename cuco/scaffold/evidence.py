"""What the program's calls say about its buffers: which buffers each call reads and writes, their shapes and element
types, and what a run costs at least.

Each call that shows a buffer's size or type offers it with a rank (a GEMM's operand sizes beat an NCCL count,
which beats the bytes of an allocation; a GEMM's or NCCL call's type beats the pointer type the program uses the
buffer as, which beats a kernel parameter's) and the reason, which the scaffold keeps as a comment; offers that
disagree are kept too, so the scaffold can say so. A call on a piece of a buffer (`a + offset`) says nothing about
the buffer's shape. A call whose effect on a buffer the rules cannot see (a kernel or function defined elsewhere)
is assumed to read and write it, and that assumption is recorded with its reason.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

from cuco.dtypes import DTYPES, NCCL_DTYPES
from cuco.fastpath.analyze import ALLOCATORS, BLAS, COPIES, FREES, NCCL_SIGNATURES, SYNCS, Analysis, Op
from cuco.fastpath.peer_loops import block
from cuco.fastpath.syntax import counting_loop, is_zero_literal, text, walk
from cuco.scaffold.c_expr import strip
from cuco.scaffold.declarations import dtype_of
from cuco.scaffold.program import Call, Program
from cuco.scaffold.size_expr import constant, dims, tidy
from cuco.scaffold.translate import Dim
from cuco.workload.expr import ExprError, eval_expr, names_in

SMALL_SIZE = 64  # the scaffold's small shapes' size (divisible by any world size up to 64)

# Per NCCL call: the send buffer's and the receive buffer's elements as multiples of its count, and the elements
# each rank must receive (C: the count), for the bound.
NCCL_SIZES: dict[str, tuple[str | None, str | None, str]] = {
    "ncclAllGather": ("1", "world", "(world - 1) * C"),
    "ncclReduceScatter": ("world", "1", "(world - 1) * C"),
    "ncclAllReduce": ("1", "1", "2 * (world - 1) * C // world"),
    "ncclBroadcast": ("1", "1", "C"),
    "ncclReduce": ("1", "1", "C"),
    "ncclAlltoAll": ("world", "world", "(world - 1) * C"),
    "ncclSend": ("1", None, "0"),
    "ncclRecv": (None, "1", "C"),
}
CUDA_TYPES = {"CUDA_R_16BF": "bf16", "CUDA_R_16F": "f16", "CUDA_R_32F": "f32", "CUDA_R_64F": "f64",
              "CUDA_R_8I": "i8", "CUDA_R_8U": "u8", "CUDA_R_32I": "i32"}
TRANSPOSED = {"CUBLAS_OP_N": False, "CUBLAS_OP_T": True, "CUBLAS_OP_C": True}
GEMM_RANK, NCCL_RANK, CAST_RANK, KERNEL_RANK, ALLOC_RANK, COPY_RANK = range(6)


@dataclass(frozen=True)
class Gemm:
    """Where a GEMM call has its sizes and operands (argument positions). cuBLAS is column-major: its m x n result
    is the row-major [n, m], and op(A) is m x k; `row_major` calls (cuco_gemm.h) take A[m, k], B[k, n], C[m, n]."""

    m: int
    n: int
    k: int
    operands: tuple[int, int, int]  # A, B, C
    lds: tuple[int | None, int | None, int | None] = (None, None, None)
    types: tuple[int, int, int] | None = None  # positions of the cudaDataType_t arguments
    dtype: str | None = None  # the call's fixed element type
    row_major: bool = False
    strides: tuple[int | str | None, int | str | None, int | str | None] | None = None  # a number: fixed
    batch: int | None = None
    beta: int | None = None  # C is read unless beta is zero
    arrays: bool = False  # operands are arrays of pointers: sizes only


def _sgemm(dtype: str) -> Gemm:
    return Gemm(3, 4, 5, (7, 9, 12), (8, 10, 13), dtype=dtype, beta=11)


def _strided(dtype: str) -> Gemm:
    return Gemm(3, 4, 5, (7, 10, 14), (8, 11, 15), dtype=dtype, strides=(9, 12, 16), batch=17, beta=13)


_CUCO = Gemm(4, 6, 5, (1, 2, 3), dtype="bf16", row_major=True)
GEMMS: dict[str, Gemm] = {
    "cuco_gemm_bf16": _CUCO, "cuco_gemm_bf16_beta": _CUCO, "cuco_gemm_bf16_accumulate": _CUCO,
    "cuco_gemm_bf16_ld": Gemm(4, 6, 5, (1, 2, 3), (None, 7, 7), dtype="bf16", row_major=True, beta=8),
    "cuco_gemm_bf16_batched": Gemm(6, 8, 7, (1, 3, 4), dtype="bf16", row_major=True, strides=(2, "0", 5),
                                     batch=9),
    "cublasSgemm": _sgemm("f32"), "cublasDgemm": _sgemm("f64"), "cublasHgemm": _sgemm("f16"),
    "cublasGemmEx": Gemm(3, 4, 5, (7, 10, 14), (9, 12, 16), types=(8, 11, 15), beta=13),
    "cublasSgemmStridedBatched": _strided("f32"), "cublasDgemmStridedBatched": _strided("f64"),
    "cublasHgemmStridedBatched": _strided("f16"),
    "cublasGemmStridedBatchedEx": Gemm(3, 4, 5, (7, 11, 16), (9, 13, 18), types=(8, 12, 17), strides=(10, 14, 19),
                                       batch=20, beta=15),
    "cublasGemmBatchedEx": Gemm(3, 4, 5, (7, 10, 14), (9, 12, 16), types=(8, 11, 15), batch=17, beta=13, arrays=True),
    "cublasSgemmBatched": Gemm(3, 4, 5, (7, 9, 12), (8, 10, 13), dtype="f32", batch=14, beta=11, arrays=True),
}
LT = "cublasLtMatmul"  # A 3 (layout 4), B 5 (6), C 7 .. beta, C 8 (9), D 10 (11)
LT_LAYOUT_CREATE, LT_LAYOUT_SET = "cublasLtMatrixLayoutCreate", "cublasLtMatrixLayoutSetAttribute"
# Calls whose effect on buffers is known (or that take none): never assumed to touch what they are passed.
KNOWN_CALLS = frozenset(NCCL_SIGNATURES) | frozenset(ALLOCATORS) | frozenset(FREES) | frozenset(COPIES) | \
    frozenset(SYNCS) | frozenset(BLAS) | frozenset(GEMMS) | {LT, "cuco_buffer", "cuco_param"}


@dataclass
class Offer:
    rank: int  # lower is more telling
    value: object
    why: str
    unsure: frozenset[str] = frozenset()


def same(a: str, b: str) -> bool:
    """Two expressions equal at a few generic sizes (every name a distinct multiple of 64, two world sizes)."""
    try:
        names = sorted((names_in(a) | names_in(b)) - {"world"})
        for world, start in ((2, 0), (4, 5)):
            primes = (67, 71, 73, 79, 83, 89, 97, 101, 103, 107, 109, 113, 127, 131, 137, 139, 149)
            env = {n: 64 * primes[(start + i) % len(primes)] for i, n in enumerate(names)}
            if eval_expr(a, {**env, "world": world}) != eval_expr(b, {**env, "world": world}):
                return False
        return True
    except ExprError:
        return False


def _product(shape: list[str]) -> str:
    return " * ".join(f"({d})" for d in shape) or "1"


# ---- what each call reads and writes ---------------------------------------------------------------------------

@dataclass
class Steps:
    """The program's calls that touch buffers, in program order, with what each reads and writes; `guessed` holds
    (op index, buffer) -> why the access is assumed rather than seen."""

    ops: list[Op]
    guessed: dict[tuple[int, str], str] = field(default_factory=dict)


def _is_zero(program: Program, call: Call, position: int | None) -> bool:
    """A GEMM's beta is zero: a literal, or a local defined once as one (`&beta` with `beta = 0.0f`)."""
    if position is None or position >= len(call.args):
        return True
    node = strip(call.args[position])
    if node is not None and node.type == "pointer_expression" and node.child_by_field_name("argument") is not None:
        node = strip(node.child_by_field_name("argument"))
    if node is not None and node.type == "identifier":  # its address is passed: it is still read only by cuBLAS
        values = program.definitions.defs.get(call.function, {}).get(text(node), [])
        node = strip(values[0]) if len(values) == 1 else None
    return node is not None and node.type == "number_literal" and is_zero_literal(text(node))


def _gemm_access(program: Program, call: Call) -> tuple[list[str], list[str]]:
    g = GEMMS.get(call.name)
    if call.name == LT:
        pos_reads, out, beta = [3, 5], 10, 7
        c_read = not _is_zero(program, call, beta)
        refs = [program.arg_ref(call, p) for p in pos_reads + ([8] if c_read else [])]
        d = program.arg_ref(call, out)
        return [r.buffer for r in refs if r], [d.buffer] if d else []
    a, b, c = (program.arg_ref(call, p) for p in g.operands)
    reads = [r.buffer for r in (a, b) if r] + ([c.buffer] if c and not _is_zero(program, call, g.beta) else [])
    return reads, [c.buffer] if c else []


def _kernel_access(program: Program, op: Op, call: Call, guessed: dict) -> tuple[list[str], list[str]]:
    """A launch's reads and writes: from the kernel's body where the program defines it, else read only where the
    argument is cast to a pointer to const, else assumed both."""
    access = program.kernel_access(op.name)
    reads, writes = [], []
    for i in range(len(call.args)):
        r = program.arg_ref(call, i)
        if r is None:
            continue
        acc = access[i] if access is not None and i < len(access) else None
        if access is None and program.call_site_const(call, i):
            reads.append(r.buffer)
            continue
        if acc is None or not acc.sure:
            why = (f"{op.name} (line {op.line}) passes it to a call the rules do not follow" if acc is not None else
                   f"{op.name} (line {op.line}) is defined outside this file")
            guessed[(op.index, r.buffer)] = why + ": it is assumed to read and write it"
            reads.append(r.buffer)
            writes.append(r.buffer)
            continue
        reads += [r.buffer] if acc.reads else []
        writes += [r.buffer] if acc.writes else []
    return list(dict.fromkeys(reads)), list(dict.fromkeys(writes))


def _opaque(program: Program, call: Call, index: int, guessed: dict) -> Op | None:
    """A call the analysis does not model that is passed buffers (a host function, a library call)."""
    refs = [(i, program.arg_ref(call, i)) for i in range(len(call.args))]
    refs = [(i, r) for i, r in refs if r is not None]
    on_device = call.function in program.kernels or call.function in program.device_functions
    if not refs or call.name in KNOWN_CALLS or call.name.isupper() or on_device:
        return None
    reads, writes = [], []
    for i, r in refs:
        reads.append(r.buffer)
        if not program.call_site_const(call, i):
            writes.append(r.buffer)
            guessed[(index, r.buffer)] = (f"{call.name} (line {call.line}) is passed it and the rules do not follow "
                                          "the call: it is assumed to read and write it")
    return Op(index, "call", call.name, call.line, call.function, {}, list(dict.fromkeys(reads)),
              list(dict.fromkeys(writes)))


def _moved(program: Program, op: Op, call: Call) -> tuple[list[str], list[str]]:
    """An NCCL call's or a copy's reads and writes: the analysis's, and the buffers the pointers it is passed point
    into (through the fields of the program's state too)."""
    if op.name in NCCL_SIGNATURES:
        sig = NCCL_SIGNATURES[op.name]
        rpos, wpos = [sig.index("send")] if "send" in sig else [], [sig.index("recv")] if "recv" in sig else []
    else:
        w, r, _ = COPIES[op.name]
        rpos, wpos = [r] if r is not None else [], [w]
    mine = [[r.buffer for p in pos if (r := program.arg_ref(call, p)) is not None] for pos in (rpos, wpos)]
    return list(dict.fromkeys(op.reads + mine[0])), list(dict.fromkeys(op.writes + mine[1]))


def _refined(op: Op, program: Program, index: int, guessed: dict) -> Op:
    """The analysis's step with the reads and writes the program shows: a kernel's from its body, a GEMM's from
    its operands, an NCCL call's or a copy's through the program's state too."""
    op = replace(op, index=index)
    call = program.call(op.line, op.name)
    if call is None:
        if op.kind == "kernel":
            guessed.update({(index, b): f"{op.name} (line {op.line}) is assumed to write it" for b in op.writes})
    elif op.kind == "kernel":
        op.reads, op.writes = _kernel_access(program, op, call, guessed)
    elif op.name in GEMMS or op.name == LT:
        op.reads, op.writes = _gemm_access(program, call)
    elif op.name in NCCL_SIGNATURES or op.name in COPIES:
        op.reads, op.writes = _moved(program, op, call)
    return op


def _unmodelled(program: Program, known: set[tuple[int, str]], found: list[Op], guessed: dict) -> None:
    """The host calls the analysis does not model: GEMMs it does not know, and calls passed buffers."""
    for call in program.calls.values():
        if (call.line, call.name) in known:
            continue
        if call.name in GEMMS and call.function not in program.kernels:
            reads, writes = _gemm_access(program, call)
            found.append(Op(len(found), "blas", call.name, call.line, call.function, {}, reads, writes))
        elif (op := _opaque(program, call, len(found), guessed)) is not None:
            found.append(op)


def steps(analysis: Analysis, program: Program) -> Steps:
    """Every call that touches a buffer, in program order: the analysis's, with each kernel's reads and writes
    from its body, and the GEMMs and other calls it does not model."""
    guessed: dict[tuple[int, str], str] = {}
    modelled = [op for op in analysis.ops if op.kind != "opaque"]  # the rules' stand-ins: read below, from bodies
    found = [_refined(op, program, i, guessed) for i, op in enumerate(modelled)]
    _unmodelled(program, {(o.line, o.name) for o in modelled}, found, guessed)
    order = {f: i for i, f in enumerate(program.functions)}
    ranked = sorted(found, key=lambda o: (order.get(o.function, len(order)), o.line, o.index))
    renumber = {o.index: i for i, o in enumerate(ranked)}
    return Steps([replace(o, index=renumber[o.index]) for o in ranked],
                 {(renumber[i], b): why for (i, b), why in guessed.items()})


# ---- shapes, types and costs -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Factor:
    """One side of a GEMM as row-major torch sees it: the buffer, its stored [rows, cols], and whether the product
    reads it transposed."""

    buffer: str
    rows: str
    cols: str
    transposed: bool


@dataclass(frozen=True)
class Product:
    """A GEMM of the run as torch writes it: out [rows, cols] = left @ right, every operand a whole buffer."""

    out: Factor
    left: Factor
    right: Factor


@dataclass
class Evidence:
    """Shapes and dtypes per buffer (the program's names), the named dimensions met, and a run's least cost."""

    program: Program
    shape: dict[str, list[Offer]] = field(default_factory=dict)
    dtype: dict[str, list[Offer]] = field(default_factory=dict)
    values: dict[str, int | None] = field(default_factory=dict)  # named dimensions, the program's value if any
    received: list[str] = field(default_factory=list)  # bytes each rank receives, per NCCL call of the run
    flops: list[str] = field(default_factory=list)  # per rank, per GEMM of the run
    products: list[Product] = field(default_factory=list)  # the run's GEMMs that torch.matmul can time as they are
    uncounted: list[str] = field(default_factory=list)  # calls of the run whose cost the rules cannot count
    literals: int = 0

    def best(self, table: dict[str, list[Offer]], buf: str) -> Offer | None:
        offers = table.get(buf, [])
        return min(offers, key=lambda o: o.rank) if offers else None

    def named(self, dim: Dim) -> Dim:
        """A bare number becomes a named dimension with that value (a size the small shapes can shrink), unless it
        is no larger than they are: a scalar (a loss, a flag) or a fixed count stays a number. Every name is
        remembered."""
        value = constant(dim.expr)
        if value is not None and value <= SMALL_SIZE:
            return Dim(str(value), {})
        if value is not None:
            self.literals += 1
            name = "count" if self.literals == 1 else f"count{self.literals}"
            dim = Dim(name, {name: value})
        for name, v in dim.params.items():
            if self.values.get(name) is None:
                self.values[name] = v
        return dim

    def offer_shape(self, buf: str | None, rank: int, parts: list[Dim], why: str) -> None:
        if buf is None:
            return
        shape = dims(parts[0].expr) if len(parts) == 1 else [d.expr for d in parts]
        self.shape.setdefault(buf, []).append(Offer(rank, shape, why, frozenset().union(*(d.unsure for d in parts))))

    def offer_dtype(self, buf: str | None, rank: int, dtype: str | None, why: str) -> None:
        if buf and dtype in DTYPES:
            self.dtype.setdefault(buf, []).append(Offer(rank, dtype, why))

    def countable(self, call: Call, dim: Dim, key: str, where: str) -> str | None:
        """How many times a call's cost counts per run: once outside loops, the product of the trip counts of the
        loops around it where each counts up from zero to a size (`s < world - 1`), else not at all and marked. Over
        a name the rules cannot follow to a size the program is given, it counts and is marked."""
        trips = [counting_loop(loop)[1] for loop in call.loops]
        bounds = [self.program.translate(t, call.function) if t is not None else None for t in trips]
        if any(b is None for b in bounds):
            self.uncounted.append(f"{key}: {where} runs in a loop; add what it costs per run")
            return None
        unsure = set(dim.unsure).union(*(b.unsure for b in bounds))
        if unsure:
            self.uncounted.append(f"{key}: {where} is counted over {', '.join(sorted(unsure))}, not a size the "
                                  "program is given (cuco_param) as far as the rules can follow; check it")
        return " * ".join(f"({b.expr})" for b in bounds) or "1"

    # ---- NCCL ----------------------------------------------------------------------------------------------
    def nccl(self, op: Op, timed: bool) -> None:
        sig, sizes = NCCL_SIGNATURES.get(op.name, ()), NCCL_SIZES.get(op.name)
        call = self.program.call(op.line, op.name)
        if call is None or sizes is None or "count" not in sig:
            return
        where = f"{op.name} (line {op.line})"
        nccl_type = getattr(NCCL_DTYPES.get(op.args.get("dtype", "")), "name", None)
        for arg, mult in (("send", sizes[0]), ("recv", sizes[1])):
            ref = self.program.arg_ref(call, sig.index(arg)) if arg in sig and mult is not None else None
            if ref is not None:
                self.offer_dtype(ref.buffer, NCCL_RANK, nccl_type, f"the type of {where}")
        count = self.program.dim(call, sig.index("count"))
        if count is None:
            if timed and sizes[2] != "0":
                self.uncounted.append(f"comm_bytes: {where} has a count the program computes from its data; add "
                                      "what it receives per run")
            return
        count = self.named(count)
        for arg, mult in (("send", sizes[0]), ("recv", sizes[1])):
            ref = self.program.arg_ref(call, sig.index(arg)) if arg in sig and mult is not None else None
            if ref is not None and ref.whole:
                expr = count.expr if mult == "1" else tidy(f"{mult} * ({count.expr})")
                self.offer_shape(ref.buffer, NCCL_RANK, [Dim(expr, count.params, count.unsure)],
                                 f"the count of {where}")
        size = NCCL_DTYPES[op.args["dtype"]].size if op.args.get("dtype") in NCCL_DTYPES else None
        if timed and sizes[2] != "0":
            if size is None:
                self.uncounted.append(f"comm_bytes: {where} moves a type the rules do not know; add its bytes")
            elif (times := self.countable(call, count, "comm_bytes", where)) is not None:
                self.received.append(_times(times, sizes[2].replace("C", f"({count.expr}) * {size}")))

    def every_peer(self, op: Op, timed: bool) -> None:
        """A send or receive of a loop over every peer that is one all-to-all (fastpath.peer_loops): its buffer is
        world blocks of its count, and the receive brings in all of them but its own."""
        call = self.program.call(op.line, op.name)
        count = self.program.dim(call, 1) if call is not None else None
        if count is None:
            return
        count = self.named(count)
        where, sizes = f"the {op.name} to every peer (line {op.line})", NCCL_SIZES["ncclAlltoAll"]
        ref = self.program.pointers.ref(call.function, block(call.args[0], op)[0])
        nccl_type = getattr(NCCL_DTYPES.get(op.args.get("dtype", "")), "name", None)
        if ref is not None:
            self.offer_dtype(ref.buffer, NCCL_RANK, nccl_type, f"the type of {where}")
            if ref.whole:
                self.offer_shape(ref.buffer, NCCL_RANK, [Dim(tidy(f"{sizes[0]} * ({count.expr})"), count.params,
                                                             count.unsure)], f"the count of {where}")
        if timed and op.name == "ncclRecv" and nccl_type is not None:
            self.received.append(sizes[2].replace("C", f"({count.expr}) * {DTYPES[nccl_type].size}"))

    # ---- GEMMs ---------------------------------------------------------------------------------------------
    def gemm(self, op: Op, timed: bool) -> None:
        call = self.program.call(op.line, op.name)
        if call is None:
            return
        if op.name == LT:
            self.lt(op, call, timed)
        elif op.name in GEMMS:
            self.table_gemm(GEMMS[op.name], op, call, timed)

    def _dim(self, call: Call, position: int | str | None) -> Dim | None:
        if position is None:
            return None
        if isinstance(position, int):
            return self.program.dim(call, position)
        return Dim(position)

    def table_gemm(self, g: Gemm, op: Op, call: Call, timed: bool) -> None:
        where = f"{op.name} (line {op.line})"
        for i, pos in enumerate(g.operands):
            ref = self.program.arg_ref(call, pos)
            dtype = g.dtype or (CUDA_TYPES.get(text(call.args[g.types[i]])) if g.types else None)
            self.offer_dtype(ref.buffer if ref else None, GEMM_RANK, dtype, f"the operand types of {where}")
        m, n, k = (self._dim(call, p) for p in (g.m, g.n, g.k))
        batch = self._dim(call, g.batch) if g.batch is not None else Dim("1")
        if None in (m, n, k, batch):
            if timed:
                self.uncounted.append(f"flops: {where} has sizes the rules cannot follow; add its flops")
            return
        m, n, k, batch = (self.named(d) for d in (m, n, k, batch))
        unsure = Dim("0", {}, m.unsure | n.unsure | k.unsure | batch.unsure)
        if timed and (times := self.countable(call, unsure, "flops", where)) is not None:
            self.flops.append(_times(times, f"2 * ({m.expr}) * ({k.expr}) * ({n.expr})" +
                                     (f" * ({batch.expr})" if g.batch is not None else "")))
        if not g.arrays:
            self.operand_shapes(g, call, (m, n, k, batch), where)
        if timed and g.batch is None and not g.arrays:
            self.product(g, call, m, n, k)

    def product(self, g: Gemm, call: Call, m: Dim, n: Dim, k: Dim) -> None:
        """The GEMM as torch.matmul on whole buffers, where each operand is one (its rows packed). cuBLAS is
        column-major: its C = op(A) op(B) is, row-major, C^T = op(B)^T op(A)^T."""
        layouts = self._layouts(g, call, m, n, k)
        refs = [self.program.arg_ref(call, pos) for pos in g.operands]
        if layouts is None or any(r is None or not r.whole for r in refs):
            return
        for i, ld in enumerate(g.lds):
            got = self._dim(call, ld)
            if ld is not None and (got is None or not same(got.expr, layouts[i][1].expr)):
                return
        (a_rows, a_cols), (b_rows, b_cols), (c_rows, c_cols) = ((r.expr, c.expr) for r, c in layouts)
        a, b, c = (r.buffer for r in refs)
        out = Factor(c, c_rows, c_cols, False)
        if g.row_major:
            self.products.append(Product(out, Factor(a, a_rows, a_cols, False), Factor(b, b_rows, b_cols, False)))
            return
        ta, tb = (TRANSPOSED[text(call.args[p])] for p in (1, 2))
        self.products.append(Product(out, Factor(b, b_rows, b_cols, tb), Factor(a, a_rows, a_cols, ta)))

    def _layouts(self, g: Gemm, call: Call, m: Dim, n: Dim, k: Dim) -> list[tuple[Dim, Dim]] | None:
        """Each operand's row-major [rows, cols], or None where a transposition is not a literal CUBLAS_OP_*."""
        if g.row_major:
            return [(m, k), (k, n), (m, n)]
        ta, tb = (TRANSPOSED.get(text(call.args[p])) if p < len(call.args) else None for p in (1, 2))
        if ta is None or tb is None:
            return None
        return [(m, k) if ta else (k, m), (k, n) if tb else (n, k), (n, m)]

    def operand_shapes(self, g: Gemm, call: Call, sizes: tuple[Dim, Dim, Dim, Dim], where: str) -> None:
        """An operand's shape where the call covers the whole buffer: its rows packed (the leading dimension is
        the row length) and, batched, its matrices packed (the stride is one matrix; 0: one shared matrix)."""
        m, n, k, batch = sizes
        layouts = self._layouts(g, call, m, n, k)
        for i, pos in enumerate(g.operands if layouts else ()):
            rows, cols = layouts[i]
            ref = self.program.arg_ref(call, pos)
            ld = self._dim(call, g.lds[i])
            if ref is None or not ref.whole or (g.lds[i] is not None and (ld is None or not same(ld.expr, cols.expr))):
                continue
            stride = self._dim(call, g.strides[i]) if g.strides else None
            parts = [rows, cols]
            if g.strides and (stride is None or not (stride.expr == "0" or same(stride.expr, _product(
                    [rows.expr, cols.expr])))):
                continue
            if g.strides and stride.expr != "0":
                parts = [self.named(batch), rows, cols]
            self.offer_shape(ref.buffer, GEMM_RANK, parts, f"the operand sizes of {where}")

    def lt(self, op: Op, call: Call, timed: bool) -> None:
        """cublasLtMatmul: sizes and types from the matrix layouts the program creates (cublasLtMatrixLayoutCreate);
        k is the dimension A and B share. A layout changed later (order, batch) is not read."""
        where = f"{op.name} (line {op.line})"
        layouts = [self.layout(call, p) for p in (4, 6, 9, 11)]
        for (pos, lay) in zip((3, 5, 8, 10), layouts):
            ref = self.program.arg_ref(call, pos)
            if ref is None or lay is None:
                continue
            self.offer_dtype(ref.buffer, GEMM_RANK, lay[0], f"the matrix layout of {where}")
            rows, cols, ld = lay[1:]
            if ref.whole and None not in (rows, cols, ld) and same(ld.expr, rows.expr):
                self.offer_shape(ref.buffer, GEMM_RANK, [self.named(cols), self.named(rows)],
                                 f"the matrix layout of {where}")
        k = _shared_k(layouts)
        if not timed:
            return
        if k is None or layouts[3] is None or None in layouts[3][1:3]:
            self.uncounted.append(f"flops: {where} has matrix layouts the rules cannot read; add its flops")
            return
        m, n = self.named(layouts[3][1]), self.named(layouts[3][2])
        k = self.named(k)
        if (times := self.countable(call, Dim("0", {}, m.unsure | n.unsure | k.unsure), "flops", where)) is not None:
            self.flops.append(_times(times, f"2 * ({m.expr}) * ({k.expr}) * ({n.expr})"))

    def layout(self, call: Call, position: int) -> tuple[str | None, Dim | None, Dim | None, Dim | None] | None:
        """(dtype, rows, cols, ld) of the layout passed at `position`, from its one creation, never changed."""
        if position >= len(call.args):
            return None
        name = _last_name(call.args[position])
        made = [c for c in self.program.calls.values() if c.name == LT_LAYOUT_CREATE and c.args and
                _last_name(c.args[0]) == name]
        changed = any(c.name == LT_LAYOUT_SET and c.args and _last_name(c.args[0]) == name
                      for c in self.program.calls.values())
        if name is None or len(made) != 1 or changed or len(made[0].args) < 5:
            return None
        c = made[0]
        return (CUDA_TYPES.get(text(c.args[1])), *(self.program.dim(c, p) for p in (2, 3, 4)))

    # ---- allocations, pointer types, copies ----------------------------------------------------------------
    def alloc(self, op: Op) -> None:
        call = self.program.call(op.line, op.name)
        if call is None:
            return
        count, dtype = self.program.alloc_count(call)
        buf, why = op.args.get("buffer"), f"{op.name} (line {op.line})"
        if count is not None:
            self.offer_shape(buf, ALLOC_RANK, [self.named(count)], f"the bytes of {why}")
        self.offer_dtype(buf, ALLOC_RANK, dtype, f"the sizeof in {why}")

    def casts(self) -> None:
        """The element type the program uses a workload buffer's pointer as (`(__nv_bfloat16*)x->ptr`)."""
        for buf, uses in self.program.pointers.casts.items():
            for ctype, line in uses:
                self.offer_dtype(buf, CAST_RANK, dtype_of(ctype), f"its pointer, used as {ctype}* (line {line})")

    def kernel_types(self, op: Op) -> None:
        """The element type of the kernel parameter a buffer is passed to."""
        call, params = self.program.call(op.line, op.name), self.program.kernels.get(op.name)
        for i, p in enumerate(params or []):
            ref = self.program.arg_ref(call, i) if call is not None and p.pointer else None
            if ref is not None:
                self.offer_dtype(ref.buffer, KERNEL_RANK, dtype_of(p.ctype),
                                 f"parameter {p.name} of {op.name} (line {op.line}), a {p.ctype}*")

    def copies(self, ops: list[Op]) -> None:
        """A whole-buffer copy between two buffers: each has the other's shape and type, where it has none."""
        for op in (o for o in ops if o.kind == "copy" and len(o.reads) == 1 and len(o.writes) == 1):
            src, dst = op.reads[0], op.writes[0]
            why = f"{op.name} (line {op.line}), which copies {src} to {dst}"
            for have, want in ((src, dst), (dst, src)):
                shape, dtype = self.best(self.shape, have), self.best(self.dtype, have)
                if shape is not None and want not in self.shape:
                    self.shape[want] = [Offer(COPY_RANK, shape.value, f"the size of {have}, by {why}", shape.unsure)]
                if dtype is not None and want not in self.dtype:
                    self.dtype[want] = [Offer(COPY_RANK, dtype.value, f"the type of {have}, by {why}")]


def _times(times: str, cost: str) -> str:
    """A call's cost over a run: once, or as many times as the loops around it run."""
    return tidy(cost if times == "1" else f"{times} * ({cost})")


def _last_name(node) -> str | None:
    """The last identifier of an expression: `&lt->aDesc` and `s->aDesc` are aDesc."""
    names = [n for n in walk(node) if n.type in ("identifier", "field_identifier")]
    return text(names[-1]) if names else None


def _shared_k(layouts) -> Dim | None:
    """The inner dimension of D = op(A) op(B): the size A has besides D's rows, equal to the one B has besides D's
    columns, whichever way each is transposed."""
    a, b, _, d = layouts
    if a is None or b is None or d is None or None in (*a[1:3], *b[1:3], *d[1:3]):
        return None
    m, n = d[1].expr, d[2].expr
    from_a = [x for x, other in ((a[2], a[1]), (a[1], a[2])) if same(other.expr, m)]
    from_b = [x for x, other in ((b[1], b[2]), (b[2], b[1])) if same(other.expr, n)]
    shared = [x for x, y in itertools.product(from_a, from_b) if same(x.expr, y.expr)]
    if not shared or any(not same(s.expr, shared[0].expr) for s in shared):
        return None
    return shared[0]


def gather(ops: list[Op], program: Program, timed: set[int], every_peer: set[int] = frozenset()) -> Evidence:
    """Every call's evidence, in program order; costs count only the calls of the timed part. EVERY_PEER: the sends
    and receives of loops over every peer that are one all-to-all."""
    ev = Evidence(program)
    for op in ops:
        if op.index in every_peer:
            ev.every_peer(op, op.index in timed)
        elif op.kind in ("collective", "p2p"):
            ev.nccl(op, op.index in timed)
        elif op.kind == "blas":
            ev.gemm(op, op.index in timed)
        elif op.kind == "alloc":
            ev.alloc(op)
        elif op.kind == "kernel":
            ev.kernel_types(op)
    ev.casts()
    ev.copies(ops)
    return ev
