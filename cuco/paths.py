"""Where cuco keeps state between commands: machine facts, the build cache, evaluation records."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def absolute(path: str | Path) -> Path:
    """A path the user gave, made absolute against the directory the command was started in (`~` expanded,
    symbolic links kept). Every path is made so where it enters cuco: the runner's processes start in folders
    of their own, where a relative path would name something else."""
    return Path(os.path.abspath(os.path.expanduser(str(path))))


def cuco_home() -> Path:
    """CUCO_HOME, or ~/.cache/cuco; created on first use."""
    home = absolute(os.environ.get("CUCO_HOME") or Path.home() / ".cache" / "cuco")
    home.mkdir(parents=True, exist_ok=True)
    return home


def build_cache_dir() -> Path:
    d = cuco_home() / "builds"
    d.mkdir(parents=True, exist_ok=True)
    return d


def machine_file() -> Path:
    return cuco_home() / "machine.json"


def records_dir() -> Path:
    d = cuco_home() / "records"
    d.mkdir(parents=True, exist_ok=True)
    return d


def baselines_file(workload: str, world: int, device: str) -> Path:
    """`cuco baseline`'s records of a workload's baselines at a world size on a device (name -> record)."""
    return cuco_home() / "baselines" / f"{workload}-w{world}-{device}.json"


def atomic_write_text(path: Path, text: str) -> Path:
    """Write so that a reader (or a kill at any moment) sees the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def atomic_write_json(path: Path, data: Any, indent: int | None = None) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=indent))
