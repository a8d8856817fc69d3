"""Why long tensor work runs below the burst ceiling: the board's power cap, measured.

Two kernels at full tensor rate, each timed alone and with 2, 4, 8 and 16 calls back to back (one CUDA graph of n
calls, L2 flushed before it, the median of REPS replays; the rate per call): cuBLAS's 8192^3 bf16 GEMM (the
ceilings' shape) and torch's cuDNN attention on a full 8192 x 8192 block at Llama-3-8B heads (ring attention's).
Then nvidia-smi's SM clock and power draw while about a second of the same calls runs, beside the clock's maximum
and the power limit. A rate
that falls as the run grows, with the clock below its maximum and the draw at the limit, is the power cap: what
`cuco doctor`'s sustained tensor rate measures and the speed of light (a burst rate) leaves out.
Writes benchmarks/results/power_cap.json and .md.

    python benchmarks/power_cap.py [--out DIR]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import record
from replay import graph_median_ms

ROOT = record.ROOT
CALLS = (1, 2, 4, 8, 16)
REPS = 5  # replays per timing: the 16-call runs last 20-30 ms each
BUSY_CALLS = 600  # queued before nvidia-smi reads the GPU: about a second of work, longer than the reading takes
H, KV, D, L = 32, 8, 128, 8192  # Llama-3-8B heads, a ring block of 8192 tokens
SMI_FIELDS = "clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu"
# Why the clocks are below their maximum (the driver's names; older drivers call them clocks_throttle_reasons).
SMI_REASONS = ",".join(f"clocks_event_reasons.{r}" for r in ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown"))


def smi(fields: str = SMI_FIELDS) -> dict[str, str]:
    """nvidia-smi's reading of GPU 0 now (empty where nvidia-smi is missing or does not know a field)."""
    try:
        proc = subprocess.run(["nvidia-smi", "-i", "0", f"--query-gpu={fields}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return {}
    if proc.returncode != 0:
        return {}
    return dict(zip(fields.split(","), (v.strip() for v in proc.stdout.strip().split(","))))


def reading_while_busy(call) -> dict[str, str]:
    """nvidia-smi's reading while BUSY_CALLS calls run: queued first, read, then waited for."""
    import torch

    for _ in range(BUSY_CALLS):
        call()
    reading = smi() | smi(SMI_REASONS)
    torch.cuda.synchronize()
    return reading


def kernels() -> dict[str, tuple[Any, float]]:
    """name -> (one call, its flops)."""
    import torch

    from cuco.kernels.attention import block_attention

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    c = torch.empty_like(a)
    q = torch.randn(L, H, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(L, KV, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return {"cuBLAS GEMM 8192^3": (lambda: torch.matmul(a, a, out=c), 2 * 8192 ** 3),
            f"cuDNN attention, full {L} x {L} block": (lambda: block_attention(q, k, v, False, backend="cudnn"),
                                                      4 * L * L * D * H)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch

    from cuco.runner.judge.l2 import L2Flush

    if not torch.cuda.is_available():
        sys.exit("power_cap: needs a CUDA GPU")
    flush = L2Flush(torch.device("cuda")).flush
    rows = []
    for name, (call, flop) in kernels().items():
        for n in CALLS:
            ms = graph_median_ms(lambda call=call, n=n: [call() for _ in range(n)], flush, REPS)
            rows.append({"kernel": name, "calls": n, "ms_per_call": ms / n, "tflops": flop * n / (ms * 1e-3) / 1e12})
            print(f"{name} x{n}: {ms / n:.3f} ms a call, {rows[-1]['tflops']:.0f} TFLOP/s", flush=True)
        rows[-1]["smi_busy"] = reading_while_busy(call)
    info = record.meta({"gpus": [{"name": torch.cuda.get_device_name()}]}, world=1, torch=torch.__version__)
    lines = ["# Long tensor work under the power cap", "",
             f"{info['date']}, {info['device']}, commit {info['commit']}, torch {info['torch']}; "
             f"`{info['command']}`. Each kernel timed alone and with n calls back to back (one CUDA graph, L2 "
             f"flushed before it, median of {REPS} replays); nvidia-smi read while {BUSY_CALLS} calls run.", "",
             "| kernel | " + " | ".join(f"{n} call{'s' if n > 1 else ''}: ms a call (TFLOP/s)" for n in CALLS)
             + " | while busy: SM clock (max), power (limit); what slows the clock |", "|---" * (len(CALLS) + 2) + "|"]
    for name in dict.fromkeys(r["kernel"] for r in rows):
        mine = [r for r in rows if r["kernel"] == name]
        s = mine[-1].get("smi_busy") or {}
        reading = (f"{s['clocks.sm']} ({s['clocks.max.sm']}), {s['power.draw']} ({s['power.limit']})"
                   if "clocks.sm" in s else "nvidia-smi missing")
        active = [f.split(".")[-1] for f in SMI_REASONS.split(",") if s.get(f) == "Active"]
        reading += f"; slowed by {', '.join(active)}" if active else ""
        lines.append(f"| {name} | " + " | ".join(f"{r['ms_per_call']:.3f} ({r['tflops']:.0f})" for r in mine)
                     + f" | {reading} |")
    record.save(args.out, "power_cap", info, {"rows": rows}, lines)  # prints the table too
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
