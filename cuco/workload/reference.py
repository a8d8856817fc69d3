"""A workload's reference.py, loaded the one way the judge and `cuco check` both load it."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from cuco.workload.spec import WorkloadSpec


class ReferenceMissing(Exception):
    """reference.py lacks a function the judge calls: the workload's fault, said with the file's path."""


def load_reference(spec: WorkloadSpec) -> ModuleType:
    mod_spec = importlib.util.spec_from_file_location(f"cuco_reference_{spec.name}", spec.reference_path)
    assert mod_spec and mod_spec.loader
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    for fn in ("make_inputs", "reference"):
        if not callable(getattr(mod, fn, None)):
            raise ReferenceMissing(f"{spec.reference_path}: defines no {fn}()")
    return mod
