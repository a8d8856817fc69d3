"""Built-in workloads by name, or any workload directory by path."""

from __future__ import annotations

import os
from pathlib import Path

from cuco.errors import CucoError
from cuco.paths import absolute


def search_path() -> list[Path]:
    """CUCO_WORKLOADS_PATH (colon-separated) first, then the workloads shipped inside the package."""
    extra = [absolute(p) for p in os.environ.get("CUCO_WORKLOADS_PATH", "").split(os.pathsep) if p]
    return extra + [Path(__file__).resolve().parents[1] / "builtin"]


def builtin_names() -> list[str]:
    names = set()
    for d in search_path():
        if d.is_dir():
            names.update(p.parent.name for p in d.glob("*/workload.toml"))
    return sorted(names)


def resolve_workload(name_or_path: str) -> Path:
    """A path to a directory with workload.toml, or the name of a built-in workload."""
    p = absolute(name_or_path)
    if p.is_dir():
        return p
    for d in search_path():
        if (d / name_or_path / "workload.toml").is_file():
            return d / name_or_path
    known = ", ".join(builtin_names()) or "none"
    raise CucoError(name_or_path, f"no such workload directory or built-in workload (built-in: {known}; "
                                  "cuco init NAME --from PROGRAM.cu makes one around a program)")
