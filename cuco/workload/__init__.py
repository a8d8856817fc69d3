"""Workloads: the spec format, its validation, and the built-in registry."""

from cuco.workload.registry import resolve_workload
from cuco.workload.spec import BufferSpec, Shape, WorkloadSpec, load_workload

__all__ = ["BufferSpec", "Shape", "WorkloadSpec", "load_workload", "resolve_workload"]
