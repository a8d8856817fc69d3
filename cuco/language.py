"""A program's language, from its file's suffix: the one place that knows which suffix is which."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from cuco.errors import CucoError

Language = Literal["cuda", "python"]
SUFFIX: dict[str, str] = {"cuda": ".cu", "python": ".py"}


def language_of(path: Path | str, where: str | None = None) -> Language:
    """cuda for a .cu file, python for a .py one; any other is the user's error, blamed on WHERE (the flag or key
    that named it; the file itself by default)."""
    suffix = Path(path).suffix
    for language, s in SUFFIX.items():
        if suffix == s:
            return language  # type: ignore[return-value]
    what = f"a program must be a .cu or .py file (CUDA or Python), not {suffix or 'one without a suffix'}"
    raise CucoError(where, f"{Path(path).name}: {what}") if where else CucoError(str(path), what)


def is_cuda(path: Path | str) -> bool:
    return Path(path).suffix == SUFFIX["cuda"]


def file_name(stem: str, language: str) -> str:
    """A program's file name in LANGUAGE: candidate.cu, candidate.py."""
    return stem + SUFFIX[language]
