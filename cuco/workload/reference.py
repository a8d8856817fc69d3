"""A workload's reference.py, loaded the one way the judge and `cuco check` both load it."""

from __future__ import annotations

import importlib.util

from cuco.workload.contract import CONTRACT, Reference
from cuco.workload.spec import WorkloadSpec


class ReferenceMissing(Exception):
    """reference.py lacks a function the judge calls: the workload's fault, said with the file's path."""


def load_reference(spec: WorkloadSpec) -> Reference:
    """reference.py run as a module; load_workload has already checked its functions' names and parameters, so
    only a name bound to something other than a function is left to find here."""
    mod_spec = importlib.util.spec_from_file_location(f"cuco_reference_{spec.name}", spec.reference_path)
    assert mod_spec and mod_spec.loader
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    for name, fn in CONTRACT.items():
        value = getattr(mod, name, None)
        if (fn.required or value is not None) and not callable(value):
            raise ReferenceMissing(f"{spec.reference_path}: defines no {fn.signature(name)} ({fn.why})")
    return Reference.of(mod)
