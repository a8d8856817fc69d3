"""Shared fixtures: an isolated CUCO_HOME per test session, GPU and nvcc markers that skip cleanly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cuco.machine import gpu_count

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ROOT / "cuco" / "builtin"
GEMM_AG = WORKLOADS / "gemm_allgather"
def _is_collective(root: Path) -> bool:
    """A benchmarked collective: a host NCCL seed and no compute of its own, so its bound is the communication's
    alone (the GEMM workloads, the KV transfer and the MoE layer time a compute; the CPU example and ring attention
    have Python seeds)."""
    from cuco.workload import load_workload
    from cuco.workload.reference import load_reference

    return (root / "seed.cu").is_file() and load_reference(load_workload(root)).compute_alone is None


COLLECTIVES = sorted(p.parent for p in WORKLOADS.glob("*/workload.toml") if _is_collective(p.parent))


@pytest.fixture(autouse=True, scope="session")
def _cuco_home(tmp_path_factory):
    """Each xdist worker has a home of its own, and all share one nvcc build cache (a folder beside theirs): builds
    are keyed by content and land by an atomic rename, so a program two workers compile is compiled once."""
    home = tmp_path_factory.mktemp("cuco_home")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "cuco_builds"
        shared.mkdir(exist_ok=True)
        (home / "builds").symlink_to(shared, target_is_directory=True)
    os.environ["CUCO_HOME"] = str(home)
    yield


def pytest_collection_modifyitems(config, items):
    from cuco.runner.build.toolchain import find_toolchain

    missing = find_toolchain().missing()
    n = gpu_count()
    for item in items:
        m = item.get_closest_marker("gpu")
        if m is not None:
            # One xdist worker runs every GPU test (with -n and --dist loadgroup): they share the machine's GPUs.
            item.add_marker(pytest.mark.xdist_group("gpu"))
            need = m.args[0] if m.args else 1
            if n < need:
                item.add_marker(pytest.mark.skip(reason=f"needs {need} GPUs, found {n}"))
        if item.get_closest_marker("nvcc") is not None and missing:
            item.add_marker(pytest.mark.skip(reason="missing " + "; ".join(missing)))
