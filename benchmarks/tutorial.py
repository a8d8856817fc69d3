"""Run docs/tutorial.md's commands from its text, in order, as a reader would, and check each one's exit code.

    python benchmarks/tutorial.py               # the CPU steps (plain `bash` blocks); the tests run this
    python benchmarks/tutorial.py --gpu         # and the `bash gpu` blocks (`bash gpu x2` too, on two GPUs), then
                                                # record their output (tutorial-w1, or tutorial-w2 on two GPUs)

A line's `# exit N` is the exit code it must end with (0 where none is written). The commands run in a new folder
that holds a copy of examples/tutorial/ and examples/tp_mlp/ (the tutorial's paths are relative to it), with a
CUCO_HOME of its own. Blocks marked `bash gpu llm` need an LLM account and are never run here.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "tutorial.md"
BLOCK = re.compile(r"^```bash([^\n]*)\n(.*?)^```", re.M | re.S)
EXPECTED = re.compile(r"\s+#\s*exit\s+(\d+)\s*$")
EXAMPLES = ("tutorial", "tp_mlp")  # the folders of examples/ the tutorial's commands name


@dataclass
class Step:
    kind: str  # "cpu" | "gpu" | "gpu x2" (two GPUs) | "gpu llm"
    command: str
    expected: int


def steps(text: str) -> list[Step]:
    out = []
    for info, body in BLOCK.findall(text):
        kind = info.strip() or "cpu"
        for line in body.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            m = EXPECTED.search(line)
            out.append(Step(kind, line[: m.start()] if m else line.strip(), int(m.group(1)) if m else 0))
    return out


def run_steps(chosen: list[Step], work: Path) -> list[dict]:
    """Each step in `work`; stops at the first whose exit code is not the one the tutorial states."""
    for example in EXAMPLES:
        shutil.copytree(ROOT / "examples" / example, work / "examples" / example)
    # `cuco` is this checkout's, whether or not one is installed: the shim runs it with this interpreter.
    shim = work / "bin" / "cuco"
    shim.parent.mkdir(parents=True, exist_ok=True)
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m cuco "$@"\n')
    shim.chmod(0o755)
    env = {**os.environ, "CUCO_HOME": str(work / "home"), "COLUMNS": "160",
           "PATH": str(shim.parent) + os.pathsep + os.environ.get("PATH", ""),
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("CUCO_WORKLOADS_PATH", None)
    done = []
    for step in chosen:
        t0 = time.monotonic()
        # A CPU step runs as on a machine without a GPU, the exit code the text states for it (4: needs GPUs) too.
        run_env = {**env, "CUDA_VISIBLE_DEVICES": ""} if step.kind == "cpu" else env
        proc = subprocess.run(["bash", "-c", step.command], cwd=work, env=run_env, capture_output=True, text=True)
        done.append({"kind": step.kind, "command": step.command, "expected": step.expected,
                     "exit": proc.returncode, "seconds": round(time.monotonic() - t0, 1),
                     "output": proc.stdout + proc.stderr})
        print(f"$ {step.command}   [{step.kind}; exit {proc.returncode}, expected {step.expected}]", flush=True)
        print(proc.stdout + proc.stderr, flush=True)
        if proc.returncode != step.expected:
            break
    return done


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", action="store_true", help="also run the `bash gpu` blocks, and record the run")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    kinds = {"cpu", "gpu"} if args.gpu else {"cpu"}
    if args.gpu:
        import torch

        if torch.cuda.device_count() >= 2:
            kinds.add("gpu x2")
    chosen = [s for s in steps(TUTORIAL.read_text()) if s.kind in kinds]
    with tempfile.TemporaryDirectory(prefix="cuco-tutorial-") as tmp:
        done = run_steps(chosen, Path(tmp))
        os.environ["CUCO_HOME"] = str(Path(tmp) / "home")  # the machine facts the steps measured
        from cuco.machine import load_machine

        machine = dict(load_machine() or {})
    if args.gpu and not machine.get("gpus"):  # the steps measured the link only: the device's name from torch
        import torch

        machine["gpus"] = [{"name": torch.cuda.get_device_name(0)}] if torch.cuda.is_available() else []
    ok = len(done) == len(chosen) and all(d["exit"] == d["expected"] for d in done)
    if args.gpu:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import record  # noqa: E402  (benchmarks/record.py, beside this script)

        world = 2 if "gpu x2" in kinds else 1
        info = record.meta(machine, world=world)
        lines = [f"# docs/tutorial.md, every step on {info['device']}", "",
                 f"{info['date']}, commit {info['commit']}, `{info['command']}`; each step's full output is in "
                 "the JSON.", "", "| step | kind | exit (expected) | seconds |", "|---|---|---|---|"]
        lines += [f"| `{d['command']}` | {d['kind']} | {d['exit']} ({d['expected']}) | {d['seconds']} |" for d in done]
        record.save(args.out, f"tutorial-w{world}", info, {"ok": ok, "steps": done}, lines)
    print("tutorial: every step ended as the text says" if ok else "tutorial: a step did not end as the text says")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
