"""A GEMM cut into chunks of the rows of one operand, so that each chunk waits only for the rows it reads (the
consumer of an all-gather) or flags only the rows it writes (the producer of a reduce-scatter's input), or into
chunks of its output's columns, each flagged as it is written (the producer of an all-reduce's input): sync chunk
(cuco/fastpath/knobs.py, cuco_gemm_rows.cuh).

Cutting is sound where the operand's rows are the output's rows (or columns): chunk [r0, r0 + n) of the operand
makes chunk [r0, r0 + n) of the output and nothing else. For cuBLAS's column-major calls those are the columns of
B with transb N (the row-major idiom C = A B passed as C^T = B^T A^T) and the columns of A with transa T; for
cuco_gemm.h's row-major calls, the rows of A. Rows along K would make partial products to add: not cut.
An all-reduce's producer is cut along the output's columns (cuBLAS's m: the rows of its column-major C), so that
each chunk reads its own columns of the weights and the weights are read once: at decode they are the GEMM's cost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cuco.fastpath.analyze import Op

BF16 = "(int64_t)sizeof(__nv_bfloat16)"
TYPED = {"cublasSgemm": "(int64_t)sizeof(float)", "cublasHgemm": "(int64_t)sizeof(__half)"}
ROW_MAJOR = ("cuco_gemm_bf16", "cuco_gemm_bf16_beta", "cuco_gemm_bf16_accumulate")
# The operands whose rows make rows of the output that lie together in memory: row-major A; column-major B (transb N).
OUTPUT_ROWS = {**{n: 1 for n in ROW_MAJOR}, "cublasGemmEx": 10, "cublasSgemm": 9, "cublasHgemm": 9}
# An assignment or increment in an argument: each chunk evaluates the arguments again.
SIDE_EFFECT = re.compile(r"\+\+|--|(?<![=!<>+\-*/%&|^])=(?!=)|[+\-*/%&|^]=|<<=|>>=")


@dataclass(frozen=True)
class RowSplit:
    """Where the rows are in the call: argument positions, and C++ text for the bytes from one row to the next."""

    operand: int  # the operand whose rows are cut
    extent: int  # the dimension that counts them
    row_bytes: str
    out: int  # the output, whose rows (or columns) follow the operand's
    out_row_bytes: str
    cast: str  # how the chunk's row count is passed: cuBLAS's dimensions are int

    def call(self, op: Op, site: int, stream: str, produces: bool) -> str:
        """OP as cuco::gemmByGatheredRows (it reads an all-gather's output) or cuco::gemmSignalRows (PRODUCES: it
        writes a reduce-scatter's input) of site SITE on STREAM: the same call, on rows [cucoRow, + cucoRows)."""
        a = list(op.operands)
        operand, out, extent = a[self.operand], a[self.out], a[self.extent]
        a[self.operand] = f"cuco::rowsAt({operand}, cucoRow, {self.row_bytes})"
        a[self.out] = f"cuco::rowsAt({out}, cucoRow, {self.out_row_bytes})"
        a[self.extent] = f"{self.cast}cucoRows"
        head = f"gemmSignalRows<{site}>(ctx, {stream}, {out}, (int64_t)({extent}), {self.out_row_bytes}" if produces \
            else f"gemmByGatheredRows<{site}>(ctx, {stream}, {operand}, (int64_t)({extent}), {self.row_bytes}"
        return f"cuco::{head}, [&](int64_t cucoRow, int64_t cucoRows) {{ return {op.name}({', '.join(a)}); }})"


def row_split(op: Op, operand: int) -> RowSplit | str:
    """How OP cuts into chunks of the rows of its argument OPERAND, or why it cannot."""
    a, name = op.operands, op.name
    if any(SIDE_EFFECT.search(x) for x in a):
        return f"{name}'s arguments assign or increment something, and each chunk would evaluate them again"
    if name in ROW_MAJOR and len(a) >= 7:
        if operand == 1:
            return RowSplit(1, 4, f"(int64_t)({a[5]}) * {BF16}", 3, f"(int64_t)({a[6]}) * {BF16}", "")
        return f"{name} reads it as B, whose rows are the product's K: chunks would be partial sums"
    if name == "cublasGemmEx" and len(a) >= 17:
        if operand == 10 and a[2].strip() == "CUBLAS_OP_N":
            return RowSplit(10, 4, f"(int64_t)({a[12]}) * cuco::dataTypeBytes({a[11]})", 14,
                            f"(int64_t)({a[16]}) * cuco::dataTypeBytes({a[15]})", "(int)")
        if operand == 7 and a[1].strip() == "CUBLAS_OP_T":
            return RowSplit(7, 3, f"(int64_t)({a[9]}) * cuco::dataTypeBytes({a[8]})", 14,
                            f"cuco::dataTypeBytes({a[15]})", "(int)")
    elif name in TYPED and len(a) >= 14:
        size = TYPED[name]
        if operand == 9 and a[2].strip() == "CUBLAS_OP_N":
            return RowSplit(9, 4, f"(int64_t)({a[10]}) * {size}", 12, f"(int64_t)({a[13]}) * {size}", "(int)")
        if operand == 7 and a[1].strip() == "CUBLAS_OP_T":
            return RowSplit(7, 3, f"(int64_t)({a[8]}) * {size}", 12, size, "(int)")
    else:
        return f"{name} is not cut by rows (a batched GEMM, or cublasLt's layouts)"
    return f"{name} reads it with its rows along K (the operand's transpose flag): chunks would be partial sums"


def output_split(op: Op) -> RowSplit | str:
    """How OP cuts into chunks of its output's rows, each chunk's rows together in memory (a producer's cut), or why
    it cannot."""
    if op.name not in OUTPUT_ROWS:
        return f"{op.name} is not cut by rows (a batched GEMM, or cublasLt's layouts)"
    split = row_split(op, OUTPUT_ROWS[op.name])
    return split if isinstance(split, RowSplit) else f"its output's rows are not cut apart: {split}"


@dataclass(frozen=True)
class ColumnSplit:
    """How a GEMM's output columns (row-major; cuBLAS's m) are cut: C++ text for the columns, the output's lines
    and their stride, an element's bytes, and the call on columns [cucoCol, + cucoCols)."""

    out: int  # the output operand
    cols: str
    lines: str
    ld: str
    elem_bytes: str
    chunk: str  # the GEMM on the chunk's columns

    def call(self, op: Op, site: int, stream: str, produces: bool = True) -> str:
        """OP as cuco::gemmSignalColumns of site SITE on STREAM (it writes an all-reduce's input)."""
        out = op.operands[self.out]
        return (f"cuco::gemmSignalColumns<{site}>(ctx, {stream}, {out}, (int64_t)({self.cols}), "
                f"(int64_t)({self.lines}), (int64_t)({self.ld}), {self.elem_bytes}, "
                f"[&](int64_t cucoCol, int64_t cucoCols) {{ return {self.chunk}; }})")


def _at(expr: str, unit: str) -> str:
    return f"cuco::rowsAt({expr}, cucoCol, {unit})"


def column_split(op: Op) -> ColumnSplit | str:
    """How OP cuts into chunks of its output's columns, or why it cannot."""
    a, name = list(op.operands), op.name
    if any(SIDE_EFFECT.search(x) for x in a):
        return f"{name}'s arguments assign or increment something, and each chunk would evaluate them again"
    if name in ROW_MAJOR and len(a) >= 7:  # (h, A, B, C, m, k, n[, beta]): B and C cut, rows n elements apart
        beta = {"cuco_gemm_bf16": "0.0f", "cuco_gemm_bf16_accumulate": "1.0f"}.get(name, a[7] if len(a) > 7 else "")
        if not beta:
            return f"{name} has fewer arguments than cuco_gemm.h's"
        chunk = (f"cuco_gemm_bf16_ld({a[0]}, {a[1]}, {_at(a[2], BF16)}, {_at(a[3], BF16)}, {a[4]}, {a[5]}, "
                 f"cucoCols, {a[6]}, {beta})")
        return ColumnSplit(3, a[6], a[4], a[6], BF16, chunk)
    if name == "cublasGemmEx" and len(a) >= 17:
        at, out, lda, ldc, lines, size = 7, 14, a[9], a[16], a[4], f"cuco::dataTypeBytes({a[15]})"
        a_unit = f"cuco::dataTypeBytes({a[8]})"
    elif name in TYPED and len(a) >= 14:
        at, out, lda, ldc, lines, size = 7, 12, a[8], a[13], a[4], TYPED[name]
        a_unit = size
    else:
        return f"{name} is not cut by columns (a batched GEMM, or cublasLt's layouts)"
    transa = a[1].strip()
    if transa not in ("CUBLAS_OP_N", "CUBLAS_OP_T"):
        return f"{name}'s transa is {transa}: the rows of its A are not known to be the output's"
    a_unit = a_unit if transa == "CUBLAS_OP_N" else f"(int64_t)({lda}) * {a_unit}"
    a[3], a[at], a[out] = "(int)cucoCols", _at(a[at], a_unit), _at(a[out], size)
    return ColumnSplit(out, op.operands[3], lines, ldc, size, f"{name}({', '.join(a)})")


@dataclass(frozen=True)
class Pieces:
    """The GEMM beside a collective at sync chunk, cut as SPLIT: it reads an all-gather's output, or (PRODUCES) writes
    a reduce-scatter's input, piece by piece."""

    gemm: Op
    split: RowSplit | ColumnSplit
    produces: bool = False
    join: int | None = None  # a reduce-scatter's: the byte where its side stream joins back
