"""Constraints between the dimensions, as code: each returns the reason a point is impossible, or None."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cuco.designspace.dimensions import Backend, Issuer, Placement, SyncScope
from cuco.designspace.directive import DesignPoint

Machine = dict[str, Any]
HOST_ISSUED = (Backend.CE, Backend.NCCL_HOST)  # backends whose transfers the host issues


def _gin_needs_nic(p: DesignPoint, m: Machine) -> str | None:
    if p.backend == Backend.GIN and not m.get("rdma_nic"):
        return "backend gin needs an RDMA NIC (GPU-initiated networking); this machine has none"
    return None


def _tile_needs_fused(p: DesignPoint, m: Machine) -> str | None:
    if p.sync == SyncScope.TILE and p.placement != Placement.FUSED:
        return "sync tile needs placement fused (flags per output tile live inside the compute kernel)"
    return None


def _deferred_is_global(p: DesignPoint, m: Machine) -> str | None:
    if p.placement == Placement.DEFERRED and p.sync != SyncScope.GLOBAL:
        return "placement deferred waits for all communication at once: sync must be global"
    return None


def _copy_engine_issues(p: DesignPoint, m: Machine) -> str | None:
    if p.backend in HOST_ISSUED and p.issuer != Issuer.CTA:
        return f"backend {p.backend} issues transfers from the host (copy engine / NCCL): issuer is cta"
    return None


def _fused_is_device(p: DesignPoint, m: Machine) -> str | None:
    if p.placement == Placement.FUSED and p.backend in HOST_ISSUED:
        return "placement fused issues communication from inside a kernel: backend must be device-side"
    return None


CONSTRAINTS: list[Callable[[DesignPoint, Machine], str | None]] = [
    _gin_needs_nic, _tile_needs_fused, _deferred_is_global, _copy_engine_issues, _fused_is_device,
]


def violations(point: DesignPoint, machine: Machine | None = None) -> list[str]:
    m = machine or {}
    return [r for c in CONSTRAINTS if (r := c(point, m))]
