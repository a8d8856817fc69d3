"""Where cuco keeps state between commands: machine facts, the build cache, evaluation records."""

from __future__ import annotations

import os
from pathlib import Path


def cuco_home() -> Path:
    """CUCO_HOME, or ~/.cache/cuco; created on first use."""
    home = Path(os.environ.get("CUCO_HOME", Path.home() / ".cache" / "cuco"))
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
