"""Scaffolding of a workload around a user's host-driven program (`cuco init`)."""

from cuco.scaffold.create import Created, create_workload

__all__ = ["Created", "create_workload"]
