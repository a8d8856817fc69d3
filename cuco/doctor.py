"""`cuco doctor`: what this machine has for cuco, and the measurements the bounds need."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

from cuco.machine import (
    gpu_inventory,
    load_machine,
    measure_rates,
    nvlink_topology,
    save_machine,
)
from cuco.runner.build.toolchain import find_toolchain
from cuco.runner.sandbox import candidate_runs_as, landlock_abi, seccomp_available


def _version(cmd: list[str]) -> str | None:
    if not shutil.which(cmd[0]):
        return None
    proc = subprocess.run(cmd, capture_output=True, text=True)
    text = (proc.stdout or proc.stderr).strip().splitlines()
    return text[0] if text else None


def links_summary(topo: str | None) -> str | None:
    """'GPU0-GPU1: NV18' pairs from `nvidia-smi topo -m`."""
    if not topo:
        return None
    rows = [line.split() for line in topo.splitlines() if line.startswith("GPU")]
    pairs = []
    for i, row in enumerate(rows):
        for j in range(i + 1, len(rows)):
            if j + 1 < len(row):
                pairs.append(f"GPU{i}-GPU{j}: {row[j + 1]}")
    return ", ".join(pairs) or None


def collect(measure: bool) -> dict[str, Any]:
    tc = find_toolchain()
    facts: dict[str, Any] = load_machine()
    try:
        import torch

        facts["torch"] = torch.__version__
        facts["torch_cuda"] = torch.version.cuda
    except ImportError:
        facts["torch"] = None
    facts["gpus"] = gpu_inventory()
    facts["links"] = links_summary(nvlink_topology())
    facts["nvcc"] = tc.nvcc_version
    facts["nccl_headers"] = tc.nccl_version
    facts["nccl_device_api"] = tc.nccl_device_api
    facts["cublas_headers"] = str(tc.cublas_include) if tc.cublas_include else None
    facts["mpi"] = _version(["mpirun", "--version"])
    facts["landlock_abi"] = landlock_abi()
    facts["seccomp"] = seccomp_available()
    facts["candidate_uid"] = candidate_runs_as()
    if measure and facts["gpus"]:
        measure_rates(facts)
    save_machine(facts)
    return facts


def _ceiling_rows(facts: dict[str, Any]) -> list[tuple[str, str]]:
    names = {"tensor_bf16_tflops": "bf16 tensor rate", "tensor_bf16_sustained_tflops": "bf16 tensor rate, sustained",
             "hbm_read_gbps": "HBM read", "hbm_write_gbps": "HBM write",
             "hbm_copy_gbps": "HBM copy", "link_one_way_gbps": "peer link, one way",
             "link_both_ways_gbps": "peer link, both ways"}
    out = []
    for key, c in (facts.get("ceilings") or {}).items():
        share = f", {c['share']:.0%} of the datasheet's {c['datasheet']:.0f}" if c.get("share") else ""
        out.append((names.get(key, key), f"{c['value']:.0f} {c['unit']}{share}: {c['method']}"))
    if facts.get("ceilings_refused"):
        out.append(("ceilings", f"not saved: {facts['ceilings_refused']}"))
    return out


def rows(facts: dict[str, Any]) -> list[tuple[str, str]]:
    gpus = facts.get("gpus") or []
    out = [("torch", f"{facts.get('torch')} (CUDA {facts.get('torch_cuda')})" if facts.get("torch")
            else "not installed"),
           ("GPUs", "; ".join(f"{g['index']}: {g['name']}, {g['sm_count']} SMs, {g['memory_gib']} GiB, sm_"
                              f"{g['capability'].replace('.', '')}" for g in gpus) or "none (CPU workloads only)"),
           ("links", facts.get("links") or "-"),
           ("nvcc", facts.get("nvcc") or "not found"),
           ("NCCL headers", f"{facts.get('nccl_headers')}, device API {'yes' if facts.get('nccl_device_api') else 'no'}"
            if facts.get("nccl_headers") else "not found (pip install nvidia-nccl-cu13==2.28.9)"),
           ("cuBLAS headers", facts.get("cublas_headers") or "not found (pip install nvidia-cublas)"),
           ("MPI", facts.get("mpi") or "not found"),
           ("sandbox", f"Landlock ABI {facts['landlock_abi']}: candidates cannot write outside their scratch folder"
            if facts.get("landlock_abi") else "no Landlock (Linux 5.13+): candidates can write wherever you can "
            "(docs/threat-model.md)"),
           ("judge's reach", "seccomp: candidates can neither trace another process nor change its scheduling or "
            "limits, nor make namespaces, io_uring, bpf or mounts; the judge checks its own" if facts.get("seccomp")
            else "no seccomp filter: the judge's own checks alone see a candidate change its scheduling or limits "
            "(docs/threat-model.md)"),
           ("candidate's uid", facts.get("candidate_uid") or "-")]
    if facts.get("peer_bw_gbps") and not (facts.get("ceilings") or {}).get("link_both_ways_gbps"):
        out.append(("peer link", f"{facts['peer_bw_gbps']:.0f} GB/s per direction, both ranks sending (measured)"))
    if facts.get("gemm_bf16_tflops") and not (facts.get("ceilings") or {}).get("tensor_bf16_tflops"):
        out.append(("bf16 GEMM", f"{facts['gemm_bf16_tflops']:.0f} TFLOP/s (measured, 8192^3, random data)"))
    out += _ceiling_rows(facts)
    out.append(("environment", _environment()))
    return out


def _environment() -> str:
    """The variables cuco reads that are set here (keys by name only): what changes its behaviour on this machine."""
    from cuco.environment import VARIABLES

    shown = [f"{v.name}={'(set)' if 'KEY' in v.name else os.environ[v.name]}" for v in VARIABLES
             if not v.internal and os.environ.get(v.name)]
    return ", ".join(shown) or "none of cuco's variables set (docs/configuration.md)"
