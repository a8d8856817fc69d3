"""The machine's ceilings, measured only on a quiet GPU: before and after the probes, no other process may hold a
GPU and the same probe must give the same rate, or the measurement is refused (Busy) rather than kept too low."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from cuco.ceilings.probes import GEMM_SHAPES, hbm_rates, link_rates, probe_gemm, sustained_tensor_rate, tensor_rate

# Datasheet figures, dense (no sparsity): bf16 tensor TFLOP/s, HBM TB/s, NVLink GB/s per direction. From NVIDIA's
# H100 and H200 product briefs (SXM5 parts; the H100 PCIe has 2.0 TB/s of HBM2e, 756 TFLOP/s and NVLink bridges).
DATASHEET: dict[str, dict[str, float]] = {
    "H200": {"tensor_bf16_tflops": 989.4, "hbm_gbps": 4800.0, "link_gbps": 450.0},
    "H100 80GB HBM3": {"tensor_bf16_tflops": 989.4, "hbm_gbps": 3350.0, "link_gbps": 450.0},
    "H100 PCIe": {"tensor_bf16_tflops": 756.0, "hbm_gbps": 2000.0, "link_gbps": 300.0},
}
STABLE = 0.08  # the probe's rate after may differ from its rate before by this much (boost clocks move a few %)


@dataclass
class Ceiling:
    value: float
    unit: str
    method: str
    datasheet: float | None = None

    @property
    def share(self) -> float | None:
        return self.value / self.datasheet if self.datasheet else None


class Busy(RuntimeError):
    """Another process uses the GPU, or the rates moved while measuring: the ceilings would be too low."""


def datasheet(gpu_name: str) -> dict[str, float]:
    """The datasheet figures of the GPU by its name (torch's), {} for a GPU not in the table."""
    for key, figures in DATASHEET.items():
        if key in gpu_name:
            return figures
    return {}


def other_processes() -> list[str]:
    """Processes other than this one that hold a GPU, as nvidia-smi lists them ([] where it is absent)."""
    if not shutil.which("nvidia-smi"):
        return []
    proc = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name", "--format=csv,noheader"],
                          capture_output=True, text=True)
    mine = str(os.getpid())
    return [line.strip() for line in proc.stdout.splitlines() if line.strip() and line.split(",")[0].strip() != mine]


def measure(gpu_name: str, probe: Callable[[], float] | None = None,
            others: Callable[[], list[str]] = other_processes,
            rates: Callable[[dict[str, float]], dict[str, Ceiling]] | None = None) -> dict[str, Ceiling]:
    """Every ceiling of this machine, or Busy naming why they would be too low. Before and after, no other process
    may hold a GPU and `probe` (a rate; the 8192^3 GEMM) must give the same within STABLE."""
    held = others()
    if held:
        raise Busy(f"other processes hold the GPU ({'; '.join(held)})")
    probe = probe or probe_gemm
    before = probe()
    out = (rates or all_rates)(datasheet(gpu_name))
    after = probe()
    held = others()
    if held:
        raise Busy(f"other processes started on the GPU while measuring ({'; '.join(held)})")
    if abs(after - before) > STABLE * max(before, after):
        raise Busy(f"the same probe ran at {before:.0f} before measuring and {after:.0f} after: something else used "
                   "the GPU, or its clocks moved")
    return out


def all_rates(sheet: dict[str, float]) -> dict[str, Ceiling]:
    """The tensor rate (burst, and sustained under the power cap), HBM read, write and copy, and (with two GPUs) the
    peer link, beside their datasheet figures."""
    tflops, how = tensor_rate()
    out = {"tensor_bf16_tflops": Ceiling(tflops, "TFLOP/s", how, sheet.get("tensor_bf16_tflops"))}
    tflops, how = sustained_tensor_rate(GEMM_SHAPES[0])
    out["tensor_bf16_sustained_tflops"] = Ceiling(tflops, "TFLOP/s", how, sheet.get("tensor_bf16_tflops"))
    for what, (rate, how) in hbm_rates().items():
        out[f"hbm_{what}_gbps"] = Ceiling(rate, "GB/s", how, sheet.get("hbm_gbps"))
    for what, (rate, how) in (link_rates() or {}).items():
        out[f"link_{what}_gbps"] = Ceiling(rate, "GB/s", how, sheet.get("link_gbps"))
    return out


def to_facts(ceilings: dict[str, Ceiling]) -> dict[str, dict[str, Any]]:
    """As machine.json keeps them: value, unit, method, datasheet figure and share."""
    return {k: {**asdict(c), "share": c.share} for k, c in ceilings.items()}
