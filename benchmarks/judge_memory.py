"""The GPU memory an evaluation holds, against the workload's own buffers: the bound's judges (the references timed
alone), then the candidate's judge and its host, at world 1, for this tree and (with --other) another checkout.

The device's used memory is read by nvidia-smi every 50 ms while each step runs, less what it read before the step
started; each process's own share is read beside it where the driver reports it (by process name: cuco-judge,
cuco-host; an older checkout's by command line). The buffers are the workload's per rank at the shape, as
workload.toml declares them.

    python benchmarks/judge_memory.py [--other OLD_CHECKOUT] [--case moe_deepseek_v3:seed:t128 ...] [--iters 5]

Writes benchmarks/results/judge_memory.json and .md (the previous pair moves to benchmarks/results/archive/).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import record

ROOT = record.ROOT
sys.path.insert(0, str(ROOT))
CASES = ["moe_deepseek_v3:seed:t128", "moe_deepseek_v3:seed:t4096", "gemm_allreduce:seed:m8",
         "gemm_allgather:seed:8k", "kv_transfer:seed:8k"]
GB = 1e9
SNIPPET = r"""
import json, sys, time
from cuco.runner.results.bounds import reference_timings
from cuco.runner.cascade import EvalOptions, evaluate
from cuco.workload import load_workload
root, name, shape, step, iters = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
spec = load_workload(root, 1)
t0 = time.monotonic()
if step == "bounds":
    _, error = reference_timings(spec, [shape], "cuda", [0], 900)
    out = {"ok": not error, "error": error or None}
else:
    rec = evaluate(spec, spec.candidates[name], EvalOptions(device="cuda", shapes=[shape], gpus=[0], iters=iters,
                                                            warmup=1))
    rec = rec.to_dict() if hasattr(rec, "to_dict") else rec
    timing = ((rec.get("shapes") or {}).get(shape) or {}).get("timing") or {}
    out = {"ok": rec["ok"], "error": rec.get("error"), "median_ms": timing.get("median_ms")}
out["seconds"] = time.monotonic() - t0
print("RESULT " + json.dumps(out))
"""


class Sampler:
    """nvidia-smi in its loop mode: the device's used memory and each process's, every `ms`."""

    def __init__(self, gpu: int, ms: int = 50) -> None:
        self.peak_used = 0.0
        self.peak_by_role: dict[str, float] = {}
        self.idle = _used(gpu)
        self.procs = [subprocess.Popen(["nvidia-smi", f"--query-{q}", "--format=csv,noheader,nounits", "-i", str(gpu),
                                        f"-lms={ms}"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                      for q in ("gpu=memory.used", "compute-apps=pid,used_memory")]
        self.threads = [threading.Thread(target=f, args=(p,), daemon=True)
                        for f, p in zip((self._device, self._apps), self.procs)]
        for t in self.threads:
            t.start()

    def _device(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            try:
                self.peak_used = max(self.peak_used, float(line.strip()) * 2**20 / GB)
            except ValueError:
                pass

    def _apps(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            try:
                pid, mib = (x.strip() for x in line.split(","))
                role = _role(int(pid))
                self.peak_by_role[role] = max(self.peak_by_role.get(role, 0.0), float(mib) * 2**20 / GB)
            except ValueError:
                pass

    def stop(self) -> dict:
        for p in self.procs:
            p.terminate()
            p.wait()
        return {"peak_gb": round(self.peak_used - self.idle, 3),
                **{f"{role}_gb": round(v, 3) for role, v in sorted(self.peak_by_role.items())}}


def _used(gpu: int) -> float:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", str(gpu)],
                         capture_output=True, text=True).stdout
    return float(out.strip()) * 2**20 / GB


_ROLES: dict[int, str] = {}


def _role(pid: int) -> str:
    """judge, host, or driver (the evaluating process itself), named once per process: a process that has just
    ended has no command line left to read."""
    if pid not in _ROLES:
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            return "gone"
        named = {"cuco-judge": "judge", "cuco-host": "host", "cuco-zygote": "zygote"}.get(name)
        _ROLES[pid] = named or ("judge" if "cuco.runner.processes.rank" in cmd else
                                "host" if "cuco.runner.processes.candidate_process" in cmd else "driver")
    return _ROLES[pid]


def buffers_gb(workload: str, shape: str) -> float:
    from cuco.dtypes import torch_dtype
    from cuco.workload import load_workload

    spec = load_workload(ROOT / "cuco" / "builtin" / workload, 1)
    env = spec.shape(shape).env(1)
    total = 0
    for b in spec.buffers.values():
        n = torch_dtype(b.dtype).itemsize
        for d in b.dims(env):
            n *= d
        total += n
    return total / GB


def machine_facts() -> Path:
    """A CUCO_HOME whose machine.json holds this machine's ceilings, measured once: without them the impossible-result
    rule falls back on the library bound, which a candidate may beat."""
    home = Path(tempfile.mkdtemp(prefix="cuco-home-"))
    subprocess.run([sys.executable, "-c", "from cuco.machine import ensure_bound_facts; ensure_bound_facts()"],
                   cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "CUCO_HOME": str(home)}, check=True)
    return home / "machine.json"


def step(tree: Path, home: Path, workload: str, name: str, shape: str, which: str, iters: int) -> dict:
    root = next(p for p in (tree / "cuco" / "builtin" / workload, tree / "workloads" / workload) if p.is_dir())
    env = {**os.environ, "PYTHONPATH": str(tree), "CUCO_HOME": str(home)}
    sampler = Sampler(0)
    proc = subprocess.run([sys.executable, "-c", SNIPPET, str(root), name, shape, which, str(iters)], cwd=tree,
                          env=env, text=True, capture_output=True)
    out = sampler.stop()
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return {**json.loads(line[7:]), **out}
    return {"ok": False, "error": (proc.stdout + proc.stderr)[-600:], **out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--other", type=Path, help="another checkout of cuco, measured the same way")
    ap.add_argument("--case", nargs="+", default=CASES, help="WORKLOAD:CANDIDATE:SHAPE")
    ap.add_argument("--iters", type=int, default=5, help="timed runs of each evaluation")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    trees = {"this tree": ROOT, **({"other": args.other.resolve()} if args.other else {})}
    facts = machine_facts()
    rows = []
    for case in args.case:
        workload, name, shape = case.split(":")
        size = buffers_gb(workload, shape)
        for label, tree in trees.items():
            home = Path(tempfile.mkdtemp(prefix="cuco-home-"))
            shutil.copy(facts, home / facts.name)
            row = {"case": case, "tree": label, "buffers_gb": round(size, 3)}
            for which in ("bounds", "eval"):
                row[which] = step(tree, home, workload, name, shape, which, args.iters)
                print(case, label, which, json.dumps(row[which]), flush=True)
            rows.append(row)
    from cuco.machine import gpu_inventory

    info = record.meta({"gpus": gpu_inventory()}, world=1, **({"other": str(args.other)} if args.other else {}))
    lines = ["# GPU memory of one evaluation at world 1, against the workload's buffers", "",
             f"{info['date']}, {info['device']}, commit {info['commit']}"
             + (f"; other: {args.other}" if args.other else "") + f". `{info['command']}`", "",
             "GB (1e9 bytes). Bounds: the peak of the bound's judge (it times the references alone). Evaluation: the "
             "peaks of the candidate's judge and its host, each read from the driver (each holds a CUDA context, "
             "about 0.5 GB), and their sum over the buffers of one rank. Device: the device's peak used memory "
             "during the evaluation, less its use before, the evaluating process's own context included.", "",
             "| case | tree | buffers | bounds | ratio | judge | host | judge + host | ratio | device | verdict | "
             "median ms | s |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b, e, size = r["bounds"], r["eval"], r["buffers_gb"]
        rank = e.get("judge_gb", 0) + e.get("host_gb", 0)
        median = f"{e['median_ms']:.4f}" if e.get("median_ms") else "-"
        lines.append(f"| {r['case']} | {r['tree']} | {size:.2f} | {b.get('judge_gb', 0):.2f} | "
                     f"{b.get('judge_gb', 0) / size:.2f} | {e.get('judge_gb', 0):.2f} | {e.get('host_gb', 0):.2f} | "
                     f"{rank:.2f} | {rank / size:.2f} | {e['peak_gb']:.2f} | {'ok' if e['ok'] else 'FAIL'} | "
                     f"{median} | {e.get('seconds') or 0:.0f} |")
    failures = [f"{r['case']} ({r['tree']}, {w}): {r[w]['error']}" for r in rows for w in ("bounds", "eval")
                if not r[w]["ok"]]
    lines += [""] + [f"- {f}" for f in failures]
    record.save(args.out, "judge_memory", info, {"rows": rows}, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
