"""The element types a workload's buffers may have: one table for the workload spec, the judge, the candidate's host,
the fast path's NCCL types and the C ABI (cuco_dtype_t in cuco/cuda/include/cuco.h lists them in this order; a test
compares the two)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DType:
    name: str  # as workload.toml writes it
    size: int  # bytes per element
    torch_name: str  # the attribute of the torch module
    c_enum: str  # the cuco_dtype_t constant; its value is the position in DTYPES
    c_type: str  # the CUDA C++ element type
    nccl: tuple[str, ...]  # ncclDataType_t names for it (nccl.h 2.28, aliases included)


_ALL = (DType("bf16", 2, "bfloat16", "CUCO_BF16", "__nv_bfloat16", ("ncclBfloat16",)),
        DType("f16", 2, "float16", "CUCO_F16", "__half", ("ncclFloat16", "ncclHalf")),
        DType("f32", 4, "float32", "CUCO_F32", "float", ("ncclFloat32", "ncclFloat")),
        DType("f64", 8, "float64", "CUCO_F64", "double", ("ncclFloat64", "ncclDouble")),
        DType("i8", 1, "int8", "CUCO_I8", "int8_t", ("ncclInt8", "ncclChar")),
        DType("u8", 1, "uint8", "CUCO_U8", "uint8_t", ("ncclUint8",)),
        DType("i32", 4, "int32", "CUCO_I32", "int32_t", ("ncclInt32", "ncclInt")),
        DType("i64", 8, "int64", "CUCO_I64", "int64_t", ("ncclInt64",)))
DTYPES: dict[str, DType] = {d.name: d for d in _ALL}
NCCL_DTYPES: dict[str, DType] = {n: d for d in _ALL for n in d.nccl}


def c_code(name: str) -> int:
    """The cuco_dtype_t value the harness passes to a candidate."""
    return list(DTYPES).index(name)


def torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, DTYPES[name].torch_name)
