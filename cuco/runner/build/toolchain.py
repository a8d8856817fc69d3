"""Find nvcc and the headers and libraries CUDA candidates build against (NCCL device API, cuBLAS).

Looked up in this order: explicit environment variables (CUCO_NVCC, CUCO_NCCL_HOME, CUCO_CUBLAS_HOME),
the pip wheels (nvidia-nccl-cu13, nvidia-cublas), then CUDA_HOME and /usr.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


@dataclass(frozen=True)
class Toolchain:
    nvcc: Path | None
    nvcc_version: str | None
    nccl_include: Path | None
    nccl_lib: Path | None
    nccl_version: str | None  # from nccl.h
    nccl_device_api: bool  # nccl_device.h present
    cublas_include: Path | None
    cublas_lib: Path | None

    def missing(self) -> list[str]:
        out = []
        if not self.nvcc:
            given = os.environ.get("CUCO_NVCC")
            out.append(f"nvcc (CUCO_NVCC={given} is no file)" if given else "nvcc (set CUCO_NVCC or put it on PATH)")
        if not self.nccl_include or not self.nccl_device_api:
            out.append("NCCL device-API headers (pip install nvidia-nccl-cu13==2.28.9, or set CUCO_NCCL_HOME)")
        if not self.cublas_include:
            out.append("cuBLAS headers (pip install nvidia-cublas, or set CUCO_CUBLAS_HOME)")
        return out


def _wheel_dir(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _first(cands: list[Path | None], name: str) -> Path | None:
    for c in cands:
        if c is not None and (c / name).exists():
            return c
    return None


def _lib_with(cands: list[Path | None], prefix: str) -> Path | None:
    for c in cands:
        if c is not None and c.is_dir() and any(c.glob(prefix + "*")):
            return c
    return None


@lru_cache(maxsize=1)
def find_toolchain() -> Toolchain:
    nvcc_s = os.environ.get("CUCO_NVCC") or shutil.which("nvcc")
    if not nvcc_s and Path("/usr/local/cuda/bin/nvcc").exists():
        nvcc_s = "/usr/local/cuda/bin/nvcc"
    nvcc = Path(nvcc_s) if nvcc_s and Path(nvcc_s).is_file() else None  # CUCO_NVCC naming nothing: missing
    nvcc_version = None
    if nvcc:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True).stdout
        m = re.search(r"release ([\d.]+)", out)
        nvcc_version = m.group(1) if m else out.strip().splitlines()[-1:]
    cuda_home = Path(os.environ.get("CUDA_HOME", nvcc.resolve().parents[1] if nvcc else "/usr/local/cuda"))

    nccl_env = os.environ.get("CUCO_NCCL_HOME")
    nccl_wheel = _wheel_dir("nvidia.nccl")
    inc_cands = [Path(nccl_env) / "include" if nccl_env else None, nccl_wheel / "include" if nccl_wheel else None,
                 cuda_home / "include", Path("/usr/include")]
    lib_cands = [Path(nccl_env) / "lib" if nccl_env else None, nccl_wheel / "lib" if nccl_wheel else None,
                 cuda_home / "lib64", Path("/usr/lib/x86_64-linux-gnu")]
    nccl_include = _first(inc_cands, "nccl.h")
    nccl_version = None
    if nccl_include:
        text = (nccl_include / "nccl.h").read_text(errors="replace")
        parts = [re.search(rf"#define NCCL_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
        if all(parts):
            nccl_version = ".".join(p.group(1) for p in parts)  # type: ignore[union-attr]

    cublas_env = os.environ.get("CUCO_CUBLAS_HOME")
    cu_wheel = _wheel_dir("nvidia.cu13")
    cublas_wheel = _wheel_dir("nvidia.cublas")
    cb_inc = [Path(cublas_env) / "include" if cublas_env else None, cu_wheel / "include" if cu_wheel else None,
              cublas_wheel / "include" if cublas_wheel else None, cuda_home / "include"]
    cb_lib = [Path(cublas_env) / "lib" if cublas_env else None, cu_wheel / "lib" if cu_wheel else None,
              cublas_wheel / "lib" if cublas_wheel else None, cuda_home / "lib64"]
    return Toolchain(
        nvcc=nvcc,
        nvcc_version=nvcc_version,
        nccl_include=nccl_include,
        nccl_lib=_lib_with(lib_cands, "libnccl.so"),
        nccl_version=nccl_version,
        nccl_device_api=bool(nccl_include and (nccl_include / "nccl_device.h").exists()),
        cublas_include=_first(cb_inc, "cublas_v2.h"),
        cublas_lib=_lib_with(cb_lib, "libcublas.so"),
    )
