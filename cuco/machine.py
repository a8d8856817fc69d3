"""Facts about this machine that the bounds need, measured once by `cuco doctor` and saved."""

from __future__ import annotations

import ctypes
import importlib.metadata
import json
import platform
import shutil
import subprocess
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

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
    two rates the library bound uses: the GEMM rate of its compute floor and the peer link's, each measured on
    its own only where the ceilings lack it."""
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
    facts["gemm_bf16_tflops"] = tensor["value"] if tensor else measure_gemm_tflops()
    facts["peer_bw_gbps"] = link["value"] if link else measure_peer_bandwidth()


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


def measure_peer_bandwidth(size_mb: int = 256, iters: int = 10) -> float | None:
    """GB/s per direction between GPU 0 and 1 with both sending at once (copy engine, cudaMemcpyPeer)."""
    import torch

    if torch.cuda.device_count() < 2:
        return None
    n = size_mb * 2**20
    a0, b0 = torch.empty(n, dtype=torch.uint8, device="cuda:0"), torch.empty(n, dtype=torch.uint8, device="cuda:0")
    a1, b1 = torch.empty(n, dtype=torch.uint8, device="cuda:1"), torch.empty(n, dtype=torch.uint8, device="cuda:1")
    a0.random_(0, 255)
    a1.random_(0, 255)
    s0, s1 = torch.cuda.Stream("cuda:0"), torch.cuda.Stream("cuda:1")
    best = 0.0
    for _ in range(iters):
        torch.cuda.synchronize("cuda:0")
        torch.cuda.synchronize("cuda:1")
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(s0):
            e0.record(s0)
            b1.copy_(a0, non_blocking=True)  # 0 -> 1
        with torch.cuda.stream(s1):
            s1.wait_event(e0)
            b0.copy_(a1, non_blocking=True)  # 1 -> 0, at the same time
        with torch.cuda.stream(s0):
            s0.wait_stream(s1)
            e1.record(s0)
        torch.cuda.synchronize("cuda:0")
        torch.cuda.synchronize("cuda:1")
        ms = e0.elapsed_time(e1)
        best = max(best, n / (ms * 1e-3) / 1e9)
    return best


def measure_gemm_tflops(n: int = 8192, iters: int = 10) -> float | None:
    """bf16 GEMM rate on random data through torch (cuBLAS)."""
    import torch

    if not torch.cuda.is_available():
        return None
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return 2 * n**3 * iters / (start.elapsed_time(end) * 1e-3) / 1e12


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
