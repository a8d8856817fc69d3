"""What every recorded benchmark shares: how it runs cuco, and what it carries beside its numbers (the date,
the device, the commit, the command).

Results are evidence only with those; each script writes <name>.json (meta plus its data) and <name>.md (a
short table) through `save`, so that they all say it the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run(*cmd: str, tail: int = 3000) -> subprocess.CompletedProcess:
    """A command from the repository root with this checkout's cuco importable, as a user would run it; the end
    of its output is echoed, all of it is returned."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(list(cmd), cwd=ROOT, env=env, text=True, capture_output=True)
    print(proc.stdout[-tail:], proc.stderr[-tail:], sep="", flush=True)
    return proc


def cuco(*args: str, tail: int = 3000) -> subprocess.CompletedProcess:
    return run(sys.executable, "-m", "cuco", *args, tail=tail)


def commit() -> str:
    """CUCO_COMMIT where set (a device copy of the tree may have no .git), else git's short hash."""
    if os.environ.get("CUCO_COMMIT"):
        return os.environ["CUCO_COMMIT"]
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else "unknown"


def meta(machine: dict[str, Any] | None = None, world: int | None = None, **extra: Any) -> dict[str, Any]:
    """machine: what `cuco doctor` saved (cuco.machine.load_machine); world: ranks used, if not every GPU."""
    gpus = (machine or {}).get("gpus") or []
    device = f"{world or len(gpus)}x {gpus[0]['name']}" if gpus else "unknown"
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": device,
            "gpu": gpus[0]["name"] if gpus else None, "links": (machine or {}).get("links"), "commit": commit(),
            "command": " ".join(["python", f"benchmarks/{Path(sys.argv[0]).name}", *sys.argv[1:]]),
            **({"world": world} if world else {}), **extra}


def save(out: Path, name: str, info: dict[str, Any], data: dict[str, Any], lines: list[str],
         with_time: bool = False) -> Path:
    """Write out/<name>-<gpu>-<date>[-<HHMM>].json and .md, and print the table."""
    gpu = (info.get("gpu") or "").replace(" ", "_")
    date = info["date"][:10].replace("-", "") + (f"-{info['date'][11:16].replace(':', '')}" if with_time else "")
    base = out / "-".join(p for p in (name, gpu, date) if p)
    out.mkdir(parents=True, exist_ok=True)
    base.with_suffix(".json").write_text(json.dumps({"meta": info, **data}, indent=1))
    base.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return base
