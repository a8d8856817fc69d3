"""What every recorded benchmark shares: how it runs cuco, what it carries beside its numbers (the date, the
device, the commit, the command), and where its results go.

Results are evidence only with those; each script writes them through `save`, so that they all say it the same
way. A benchmark's current result has a stable name, results/<name>.json (meta plus its data) and
results/<name>.md (a short table); the result it replaces moves to results/archive/ under its dated name,
<name>-<gpu>-<YYYYMMDD>[-<HHMM>]. A partial run (an experiment on a subset) goes straight to archive/.

Results written elsewhere (a device machine's output folder) are installed the same way:

    python benchmarks/record.py adopt DIR_OR_FILE...
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # this checkout's cuco, for every benchmark that imports it
    sys.path.insert(0, str(ROOT))


def run(*cmd: str, tail: int = 3000, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """A command from the repository root with this checkout's cuco importable, as a user would run it (`env`:
    variables set for it alone); the end of its output is echoed, all of it is returned."""
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(list(cmd), cwd=ROOT, env=env, text=True, capture_output=True)
    print(proc.stdout[-tail:], proc.stderr[-tail:], sep="", flush=True)
    return proc


def cuco(*args: str, tail: int = 3000, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return run(sys.executable, "-m", "cuco", *args, tail=tail, env=env)


def search(workload: str, run_dir: Path, world: int | None = None, settings: dict[str, Any] | None = None):
    """`cuco evolve WORKLOAD --run-dir RUN_DIR` through the library's front door (cuco.search), this checkout's cuco:
    `settings` are run.toml keys ({"search.shape": "8k", "search.generations": 40}). Each finished evaluation is
    printed; a search cuco refuses is printed and returns None (its run directory may hold nothing)."""
    from cuco.errors import CucoError
    from cuco.evolve.config import apply_overrides, load_config
    from cuco.search import prepare_search, run_search
    from cuco.workload import load_workload, resolve_workload

    def progress(event, evolution) -> None:
        c = event.candidate
        if event.kind == "done" and c is not None:
            what = f"{c.median_ms:.4f} ms" if c.ok and c.median_ms else f"failed at {c.failed_level}"
            print(f"  #{c.id} {c.label or '-'}: {what}", flush=True)
        elif event.kind in ("baseline", "round", "stopped"):
            print(f"  {event.kind}: {event.text}", flush=True)

    try:
        cfg = apply_overrides(load_config(None), [f"{k}={v}" for k, v in (settings or {}).items()])
        prepared = prepare_search(load_workload(resolve_workload(workload), world), cfg, run_dir, note=print)
        print(prepared.headline(), flush=True)
        try:
            return run_search(prepared, on_event=progress)
        finally:
            prepared.close()
    except CucoError as exc:
        print(f"error: {exc}", flush=True)
        return None


def summarize(run_dir: Path) -> dict[str, Any]:
    """A finished (or cut-off) search read through its store: evaluations, failures, the seed's time, the best with
    its bound and speed of light, where it was found. With no correct candidate, best is a row saying so (NaN times),
    so that the tables are still written."""
    from cuco.errors import CucoError
    from cuco.evolve.rundir import RunDir

    nan = float("nan")
    empty = {"evaluations": 0, "failed": 0, "seed_ms": nan, "best": {"label": "no run", "median_ms": nan,
             "bound_ms": nan, "speed_of_light_ms": nan}, "best_found_at": None, "speedup_over_seed": nan,
             "best_over_bound": nan, "eval_seconds_mean": nan, "candidates": []}
    try:
        db = RunDir(run_dir).readable().open(readonly=True)
    except CucoError:
        return empty
    try:
        done = list(db.iter_done())
    finally:
        db.close()
    rows = [{"id": c.id, "label": c.label, "proposer": c.proposer, "ok": c.ok, "failed_level": c.failed_level,
             "score": c.score, "median_ms": c.median_ms, "bound_ms": c.bound_ms, "finished_at": c.finished_at,
             "eval_seconds": c.eval_seconds} for c in done]
    seed_ms = next((r["median_ms"] for r in rows if r["proposer"] == "seed" and r["median_ms"]), nan)
    ok = [r for r in rows if r["ok"] and r["score"] is not None]
    if not ok:
        return {**empty, "evaluations": len(rows), "failed": len(rows), "seed_ms": seed_ms,
                "best": {**empty["best"], "label": "none correct"}, "candidates": rows}
    best = max(ok, key=lambda r: r["score"])
    record = json.loads(next(c.record for c in done if c.id == best["id"]) or "{}")
    lights = [(s.get("bound") or {}).get("speed_of_light_ms") for s in (record.get("shapes") or {}).values()]
    best["speed_of_light_ms"] = next((x for x in lights if x), nan)  # one shape: the search's
    return {"evaluations": len(rows), "failed": len(rows) - len(ok), "seed_ms": seed_ms, "best": best,
            "best_found_at": rows.index(best) + 1, "speedup_over_seed": seed_ms / best["median_ms"],
            "best_over_bound": best["median_ms"] / best["bound_ms"] if best["bound_ms"] else nan,
            "eval_seconds_mean": sum(r["eval_seconds"] or 0 for r in rows) / len(rows), "candidates": rows}


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


def stamp(name: str, info: dict[str, Any], with_time: bool = False) -> str:
    """The dated name of a result: <name>-<gpu>-<YYYYMMDD>[-<HHMM>], from its meta."""
    gpu = (info.get("gpu") or "").replace(" ", "_")
    date = info.get("date") or ""
    day = date[:10].replace("-", "")
    return "-".join(p for p in (name, gpu, day + (f"-{date[11:16].replace(':', '')}" if with_time else "")) if p)


def _free(folder: Path, base: str, info: dict[str, Any]) -> Path:
    """folder/base, or with the time of day (then a count) added where a file of that name is already kept."""
    date = info.get("date") or ""
    hhmm = date[11:16].replace(":", "")
    candidates = [base] + ([f"{base}-{hhmm}"] if hhmm and not base.endswith(hhmm) else [])
    candidates += [f"{candidates[-1]}-{i}" for i in range(2, 100)]
    for c in candidates:
        if not any((folder / (c + ext)).exists() for ext in (".json", ".md")):
            return folder / c
    raise FileExistsError(f"{folder / base}: too many results of that name")


def _read_meta(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text()).get("meta") or {}
    except (OSError, ValueError, AttributeError):
        return {}


def retire(out: Path, name: str, info: dict[str, Any] | None = None, with_time: bool = False) -> Path | None:
    """Move out/<name>.json and .md to out/archive/ under their dated name, unless they are the same run as
    `info` (a script that rewrites its file as it goes). Returns where they went, or None."""
    current = out / f"{name}.json"
    if not current.is_file():
        return None
    old = _read_meta(current)
    if info is not None and old.get("date") == info.get("date") and old.get("command") == info.get("command"):
        return None
    (out / "archive").mkdir(parents=True, exist_ok=True)
    dest = _free(out / "archive", stamp(name, old, with_time), old)
    for ext in (".json", ".md"):
        if (out / f"{name}{ext}").is_file():
            os.replace(out / f"{name}{ext}", dest.with_suffix(ext))
    return dest


def save(out: Path, name: str, info: dict[str, Any], data: dict[str, Any], lines: list[str],
         with_time: bool = False, current: bool = True) -> Path:
    """Write the result as out/<name>.json and .md, retiring the one it replaces to out/archive/, and print the
    table. current=False (a partial run): out/archive/<name>-<gpu>-<date>[-<HHMM>] instead, the current kept."""
    out.mkdir(parents=True, exist_ok=True)
    if current:
        retire(out, name, info, with_time)
        base = out / name
    else:
        (out / "archive").mkdir(exist_ok=True)
        base = _free(out / "archive", stamp(name, info, with_time), info)
    base.with_suffix(".json").write_text(json.dumps({"meta": info, **data}, indent=1))
    base.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return base


def adopt(sources: list[Path], results: Path = ROOT / "benchmarks" / "results") -> list[Path]:
    """Install results written elsewhere: each <name>.json (with its .md) becomes the current one, the one it
    replaces retired; files under a source folder's archive/ join results/archive/ as they are."""
    installed = []
    for src in sources:
        files = sorted(src.glob("*.json")) if src.is_dir() else [src.with_suffix(".json")]
        for f in files:
            if not _read_meta(f):
                print(f"skipped {f}: no meta", file=sys.stderr)
                continue
            retire(results, f.stem, None, with_time=True)
            for ext in (".json", ".md"):
                if f.with_suffix(ext).is_file():
                    shutil.copyfile(f.with_suffix(ext), results / f"{f.stem}{ext}")
            installed.append(results / f.stem)
        kept = src / "archive" if src.is_dir() else None
        if kept and kept.is_dir():
            (results / "archive").mkdir(exist_ok=True)
            for f in sorted(kept.iterdir()):
                if f.is_file() and not (results / "archive" / f.name).exists():
                    shutil.copyfile(f, results / "archive" / f.name)
                    installed.append(results / "archive" / f.name)
    return installed


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "adopt":
        sys.exit("usage: python benchmarks/record.py adopt DIR_OR_FILE...")
    for p in adopt([Path(a) for a in sys.argv[2:]]):
        print(f"installed {p.relative_to(ROOT)}")
