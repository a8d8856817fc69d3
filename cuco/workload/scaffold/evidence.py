"""What the program's calls say about its buffers: shapes, element types, and what a run costs at least.

Each call that shows a buffer's size or type offers it with a rank (a GEMM's operand sizes beat an NCCL count,
which beats the bytes of an allocation) and the reason, which the scaffold keeps as a comment. A call on a
piece of a buffer (`a + offset`) says nothing about the buffer's shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cuco.dtypes import DTYPES, NCCL_DTYPES
from cuco.fastpath.analyze import NCCL_SIGNATURES, Analysis, Op
from cuco.workload.scaffold.program import Dim, Program, constant, dims, tidy

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
# GEMMs whose operand sizes the call spells out: positions of A, B, C, m, k, n (row-major A[m,k] B[k,n] C[m,n]).
GEMMS: dict[str, tuple[int, int, int, int, int, int]] = {"cuco_gemm_bf16": (1, 2, 3, 4, 5, 6)}
BLAS_DTYPES = {"cublasSgemm": "f32", "cublasHgemm": "f16", "cuco_gemm_bf16": "bf16"}
GEMM_RANK, NCCL_RANK, ALLOC_RANK, COPY_RANK = 0, 1, 2, 3


@dataclass
class Offer:
    rank: int  # lower is more telling
    value: object
    why: str
    unsure: frozenset[str] = frozenset()


@dataclass
class Evidence:
    """Shapes and dtypes per buffer (the program's names), the named dimensions met, and a run's least cost."""

    program: Program
    shape: dict[str, Offer] = field(default_factory=dict)
    dtype: dict[str, Offer] = field(default_factory=dict)
    values: dict[str, int | None] = field(default_factory=dict)  # named dimensions, the program's value if any
    received: list[str] = field(default_factory=list)  # bytes each rank receives, per NCCL call of the run
    flops: list[str] = field(default_factory=list)  # per rank, per GEMM of the run
    uncounted: list[str] = field(default_factory=list)  # calls of the run whose cost the program decides as it runs
    literals: int = 0

    def named(self, dim: Dim) -> Dim:
        """A bare number becomes a named dimension with that value; every name is remembered."""
        value = constant(dim.expr)
        if value is not None:
            self.literals += 1
            name = "count" if self.literals == 1 else f"count{self.literals}"
            dim = Dim(name, {name: value})
        for name, v in dim.params.items():
            if self.values.get(name) is None:
                self.values[name] = v
        return dim

    def offer_shape(self, buf: str | None, rank: int, parts: list[Dim], why: str) -> None:
        if buf is None or (buf in self.shape and self.shape[buf].rank <= rank):
            return
        shape = dims(parts[0].expr) if len(parts) == 1 else [d.expr for d in parts]
        self.shape[buf] = Offer(rank, shape, why, frozenset().union(*(d.unsure for d in parts)))

    def offer_dtype(self, buf: str | None, rank: int, dtype: str | None, why: str) -> None:
        if buf and dtype in DTYPES and (buf not in self.dtype or self.dtype[buf].rank > rank):
            self.dtype[buf] = Offer(rank, dtype, why)

    def nccl(self, op: Op, timed: bool) -> None:
        sig, sizes = NCCL_SIGNATURES.get(op.name, ()), NCCL_SIZES.get(op.name)
        call = self.program.call(op.line, op.name)
        count = self.program.dim(call, sig.index("count")) if call and sizes and "count" in sig else None
        if count is None:
            return
        count, where = self.named(count), f"{op.name} (line {op.line})"
        ends = (("send", op.reads, sizes[0]), ("recv", op.writes, sizes[1]))
        for arg, bufs, mult in ends:
            if arg not in sig or not bufs or mult is None:
                continue
            self.offer_dtype(bufs[0], NCCL_RANK, getattr(NCCL_DTYPES.get(op.args.get("dtype", "")), "name", None),
                              f"the type of {where}")
            if not self.program.is_piece(call, sig.index(arg)):
                expr = count.expr if mult == "1" else tidy(f"{mult} * ({count.expr})")
                self.offer_shape(bufs[0], NCCL_RANK, [Dim(expr, count.params, count.unsure)], f"the count of {where}")
        size = NCCL_DTYPES[op.args["dtype"]].size if op.args.get("dtype") in NCCL_DTYPES else None
        if timed and size and sizes[2] != "0" and self.countable(call, count, "comm_bytes", where):
            self.received.append(sizes[2].replace("C", f"({count.expr}) * {size}"))

    def countable(self, call, dim: Dim, key: str, where: str) -> bool:
        """A call's cost counts once per run only outside loops and over sizes the program is given."""
        if call.in_loop or dim.unsure:
            why = "runs in a loop" if call.in_loop else "has sizes the program computes as it runs"
            self.uncounted.append(f"{key}: {where} {why}; add what it costs per run")
            return False
        return True

    def blas(self, op: Op, timed: bool) -> None:
        for buf in op.reads + op.writes:
            self.offer_dtype(buf, GEMM_RANK, BLAS_DTYPES.get(op.name), f"{op.name} (line {op.line})")
        layout, call = GEMMS.get(op.name), self.program.call(op.line, op.name)
        if layout is None or call is None or len(op.reads) != 2 or len(op.writes) != 1:
            return
        m, k, n = (self.program.dim(call, p) for p in layout[3:])
        if m is None or k is None or n is None:
            return
        m, k, n = self.named(m), self.named(k), self.named(n)
        unsure = Dim("0", {}, m.unsure | k.unsure | n.unsure)
        if timed and self.countable(call, unsure, "flops", f"{op.name} (line {op.line})"):
            self.flops.append(f"2 * ({m.expr}) * ({k.expr}) * ({n.expr})")
        for buf, pos, pair in zip(op.reads + op.writes, layout[:3], ((m, k), (k, n), (m, n))):
            if not self.program.is_piece(call, pos):
                self.offer_shape(buf, GEMM_RANK, list(pair), f"the operand sizes of {op.name} (line {op.line})")

    def alloc(self, op: Op) -> None:
        call = self.program.call(op.line, op.name)
        if call is None:
            return
        count, dtype = self.program.alloc_count(call)
        buf, why = op.args.get("buffer"), f"{op.name} (line {op.line})"
        if count is not None:
            self.offer_shape(buf, ALLOC_RANK, [self.named(count)], f"the bytes of {why}")
        self.offer_dtype(buf, ALLOC_RANK, dtype, f"the sizeof in {why}")

    def copies(self, ops: list[Op]) -> None:
        """A whole-buffer copy between two buffers: each has the other's shape and type, where it has none."""
        for op in (o for o in ops if o.kind == "copy" and len(o.reads) == 1 and len(o.writes) == 1):
            src, dst = op.reads[0], op.writes[0]
            why = f"{op.name} (line {op.line}), which copies {src} to {dst}"
            for have, want in ((src, dst), (dst, src)):
                if have in self.shape and want not in self.shape:
                    got = self.shape[have]
                    self.shape[want] = Offer(COPY_RANK, got.value, f"the size of {have}, by {why}", got.unsure)
                if have in self.dtype and want not in self.dtype:
                    self.dtype[want] = Offer(COPY_RANK, self.dtype[have].value, f"the type of {have}, by {why}")


def gather(analysis: Analysis, program: Program, timed: list[Op]) -> Evidence:
    """Every call's evidence, in program order; costs count only the calls of the timed part."""
    ev = Evidence(program)
    in_run = {o.index for o in timed}
    for op in analysis.ops:
        if op.kind in ("collective", "p2p"):
            ev.nccl(op, op.index in in_run)
        elif op.kind == "blas":
            ev.blas(op, op.index in in_run)
        elif op.kind == "alloc":
            ev.alloc(op)
    ev.copies(analysis.ops)
    return ev
