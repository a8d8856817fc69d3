"""nvcc builds of CUDA candidates into shared libraries, cached by content hash.

The key covers the source, cuco.h, the compiler's version, the flags and the libraries linked, so a
changed header or toolchain never reuses a stale library. A failed build is cached too, with the
compiler's output, so the proposer sees the same diagnostics without paying for the compile again.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from cuco.paths import build_cache_dir
from cuco.runner.toolchain import Toolchain, find_toolchain

INCLUDE_DIR = Path(__file__).resolve().parents[1] / "cuda" / "include"
HARNESS_SRC = Path(__file__).resolve().parents[1] / "cuda" / "harness.cu"
# Hopper (H100/H200) by default; CUCO_CUDA_ARCH="90a" or "100" etc. to target others.
DEFAULT_ARCH = "90"


@dataclass(frozen=True)
class BuildResult:
    ok: bool
    library: Path | None
    log: str
    cached: bool
    seconds: float
    command: list[str]


def _lib_file(d: Path | None, prefix: str) -> Path | None:
    if d is None:
        return None
    files = sorted(d.glob(prefix + "*"), key=lambda p: len(p.name))
    return files[0] if files else None


def nvcc_command(src: Path, out: Path, tc: Toolchain, arch: str) -> list[str]:
    cmd = [str(tc.nvcc), "-O3", "-std=c++17", "-lineinfo", "-shared", "-Xcompiler", "-fPIC,-fvisibility=hidden",
           f"-gencode=arch=compute_{arch},code=sm_{arch}", "-I", str(INCLUDE_DIR)]
    for inc in (tc.nccl_include, tc.cublas_include):
        if inc:
            cmd += ["-I", str(inc)]
    cmd += ["-o", str(out), str(src)]
    for d, prefix in ((tc.nccl_lib, "libnccl.so"), (tc.cublas_lib, "libcublas.so")):
        lib = _lib_file(d, prefix)
        if lib:
            cmd += [f"-L{lib.parent}", f"-l:{lib.name}", f"-Xlinker=-rpath,{lib.parent}"]
    return cmd


def build_key(src_text: str, cmd_template: list[str], tc: Toolchain) -> str:
    h = hashlib.sha256()
    h.update(src_text.encode())
    for header in sorted(p for p in INCLUDE_DIR.rglob("*") if p.is_file()):  # .h and .cuh alike
        h.update(header.name.encode())
        h.update(header.read_bytes())
    h.update(json.dumps([cmd_template, tc.nvcc_version, tc.nccl_version]).encode())
    return h.hexdigest()[:24]


def build(src: Path, arch: str | None = None, toolchain: Toolchain | None = None) -> BuildResult:
    """Compile `src` into a shared library (or return the cached one)."""
    tc = toolchain or find_toolchain()
    arch = arch or os.environ.get("CUCO_CUDA_ARCH", DEFAULT_ARCH)
    missing = tc.missing()
    if missing:
        return BuildResult(False, None, "cannot build: missing " + "; ".join(missing), False, 0.0, [])
    text = Path(src).read_text()
    template = nvcc_command(Path("SRC.cu"), Path("OUT.so"), tc, arch)
    key = build_key(text, template, tc)
    d = build_cache_dir() / key
    lib, status = d / "candidate.so", d / "status.json"
    if status.is_file():
        st = json.loads(status.read_text())
        return BuildResult(st["ok"], lib if st["ok"] else None, (d / "build.log").read_text(), True, 0.0, st["command"])

    d.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=d.parent))
    (tmp / "candidate.cu").write_text(text)
    cmd = nvcc_command(tmp / "candidate.cu", tmp / "candidate.so", tc, arch)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
    secs = time.perf_counter() - t0
    ok = proc.returncode == 0 and (tmp / "candidate.so").is_file()
    log = (proc.stdout + proc.stderr).replace(str(tmp / "candidate.cu"), Path(src).name)
    (tmp / "build.log").write_text(log)
    (tmp / "status.json").write_text(json.dumps({"ok": ok, "command": cmd, "seconds": secs, "source": str(src)}))
    try:
        tmp.rename(d)  # atomic: a concurrent build of the same key keeps the first
    except OSError:
        pass
    final = d if d.is_dir() else tmp
    return BuildResult(ok, final / "candidate.so" if ok else None, log, False, secs, cmd)


def build_harness(arch: str | None = None) -> BuildResult:
    return build(HARNESS_SRC, arch)
