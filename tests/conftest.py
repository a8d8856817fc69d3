"""Shared fixtures: an isolated CUCO_HOME per test session, GPU and nvcc markers that skip cleanly."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ROOT / "cuco" / "workloads"
GEMM_AG = WORKLOADS / "gemm_allgather"
# The benchmarked collectives: a host NCCL seed each, and the device programs the library offers for it (the
# GEMM workloads, the KV transfer and the MoE layer are programs around communication, not collectives; the CPU
# example and ring attention have Python seeds).
COLLECTIVES = sorted(p.parent for p in WORKLOADS.glob("*/workload.toml")
                     if (p.parent / "seed.cu").is_file()
                     and not p.parent.name.startswith(("gemm_", "kv_transfer", "moe_")))


def workload_reference(name: str):
    """A built-in workload's reference.py, as a module."""
    spec = importlib.util.spec_from_file_location(f"{name}_reference", WORKLOADS / name / "reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(autouse=True, scope="session")
def _cuco_home(tmp_path_factory):
    os.environ["CUCO_HOME"] = str(tmp_path_factory.mktemp("cuco_home"))
    yield


def gpu_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config, items):
    from cuco.runner.toolchain import find_toolchain

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
