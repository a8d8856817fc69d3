"""The element types a workload's buffers may have: one table for the workload spec, the judge, the candidate's host
and the C ABI (cuco_dtype_t in cuco/cuda/include/cuco.h lists them in this order; a test compares the two)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DType:
    name: str  # as workload.toml writes it
    size: int  # bytes per element
    torch_name: str  # the attribute of the torch module
    c_enum: str  # the cuco_dtype_t constant; its value is the position in DTYPES


_ALL = (DType("bf16", 2, "bfloat16", "CUCO_BF16"), DType("f16", 2, "float16", "CUCO_F16"),
        DType("f32", 4, "float32", "CUCO_F32"), DType("f64", 8, "float64", "CUCO_F64"),
        DType("i8", 1, "int8", "CUCO_I8"), DType("u8", 1, "uint8", "CUCO_U8"),
        DType("i32", 4, "int32", "CUCO_I32"), DType("i64", 8, "int64", "CUCO_I64"))
DTYPES: dict[str, DType] = {d.name: d for d in _ALL}


def c_code(name: str) -> int:
    """The cuco_dtype_t value the harness passes to a candidate."""
    return list(DTYPES).index(name)


def torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, DTYPES[name].torch_name)
