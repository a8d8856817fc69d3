"""Facts about this machine that the bounds need, measured once by `cuco doctor` and saved."""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import json
import platform
import shutil
import subprocess
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from cuco.errors import CucoError, NeedsGPU
from cuco.extras import require
from cuco.paths import atomic_write_json, machine_file

# NVLink multicast stays off in every program cuco starts: on shared hosts it can take GPUs out of service.
# The runner sets these last, so nothing (a workload's [nccl_env] included) can change them.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def gpu_count() -> int:
    """The CUDA devices this process may use (CUDA_VISIBLE_DEVICES honoured), asked of the driver itself: a command
    that only needs the count (is there a GPU for this world size?) does not import torch for it, two CPU-seconds."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:  # no NVIDIA driver on this machine
        return 0
    count = ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:  # CUDA_SUCCESS is 0
        return 0
    return count.value


def gpus_in_words(count: int) -> str:
    """'1 GPU', '2 GPUs': the count of GPUs a message names."""
    return f"{count} GPU" + ("" if count == 1 else "s")


def resolve_device(choice: str, world: int, where: str = "--device") -> str:
    """auto, cuda or cpu, as the device evaluations run on: auto is cuda where this machine has a GPU per rank.
    Every evaluation's judges import torch, so its absence is said here, before anything runs."""
    if choice not in ("auto", "cuda", "cpu"):
        raise CucoError(where, f"expected auto, cuda or cpu, got {choice!r}")
    if importlib.util.find_spec("torch") is None:
        require("torch")
    if choice == "cuda" and gpu_count() < world:
        raise NeedsGPU(f"{where} cuda", f"needs {world} GPUs, this machine has {gpu_count()}")
    if choice != "auto":
        return choice
    return "cuda" if gpu_count() >= world else "cpu"


def load_machine() -> dict[str, Any]:
    path = machine_file()
    return json.loads(path.read_text()) if path.is_file() else {}


def save_machine(facts: dict[str, Any]) -> None:
    atomic_write_json(machine_file(), facts, indent=1)


def ensure_bound_facts(say: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """The facts a GPU bound needs (peer-link bandwidth, the ceilings and GEMM rate), measured once on this machine
    where `cuco doctor` has not, each by its key's absence (a machine of one GPU keeps a link rate of None; a
    refused measurement of the ceilings waits for doctor to retry): on a cluster, each node measures its own."""
    facts = load_machine()
    if "peer_bw_gbps" in facts and "gemm_bf16_tflops" in facts:
        return facts
    say("measuring the machine's ceilings for the bounds (once; see cuco doctor)")
    measure_rates(facts)
    save_machine(facts)
    return facts


def measure_rates(facts: dict[str, Any]) -> None:
    """The ceilings into `facts` (cuco.ceilings), or the reason they were refused (a busy GPU); and from them the
    two rates the library bound uses: the GEMM rate of its compute floor and the peer link's. A refusal stays a
    refusal: no rate is taken on the busy GPU the ceilings would not measure (the bounds then go without it, and
    `cuco doctor` measures again)."""
    from cuco.ceilings import Busy, measure, to_facts

    gpus = facts.get("gpus") or gpu_inventory()
    if not gpus:
        return
    try:
        facts["ceilings"] = to_facts(measure(gpus[0]["name"]))
        facts.pop("ceilings_refused", None)
    except Busy as exc:
        facts["ceilings_refused"] = str(exc)
    ceilings = facts.get("ceilings") or {}
    tensor, link = ceilings.get("tensor_bf16_tflops"), ceilings.get("link_both_ways_gbps")
    facts["gemm_bf16_tflops"] = tensor["value"] if tensor else None
    facts["peer_bw_gbps"] = link["value"] if link else None  # one GPU has no peer link


def gpu_inventory() -> list[dict[str, Any]]:
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append({"index": i, "name": p.name, "sm_count": p.multi_processor_count,
                    "memory_gib": round(p.total_memory / 2**30, 1), "capability": f"{p.major}.{p.minor}",
                    "l2_mb": round(getattr(p, "L2_cache_size", 0) / 2**20, 1)})
    return out


def nvlink_topology() -> str | None:
    """`nvidia-smi topo -m` as text: how the GPUs are linked (NV18 = 18 NVLinks)."""
    if not shutil.which("nvidia-smi"):
        return None
    proc = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


def fingerprint() -> dict[str, Any]:
    """Environment stored with every record."""
    info: dict[str, Any] = {"host": platform.node(), "python": platform.python_version(),
                            "time": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    try:
        info["torch"] = importlib.metadata.version("torch")  # without importing it (two CPU-seconds) on the CPU
    except importlib.metadata.PackageNotFoundError:
        return info
    if gpu_count():
        import torch

        info["gpus"] = [g["name"] for g in gpu_inventory()]
        info["cuda"] = torch.version.cuda
    return info
