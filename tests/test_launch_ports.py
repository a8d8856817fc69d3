"""A process-group port taken between the launcher's pick and a rank's bind costs a relaunch, not a verdict."""

from __future__ import annotations

import socket

from conftest import WORKLOADS

from cuco.runner.cascade import EvalOptions, evaluate
from cuco.runner.processes import launch
from cuco.workload import load_workload


def test_a_port_taken_before_the_judges_bind_it_is_picked_again(tmp_path, monkeypatch):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    picks = []
    real = launch.free_port

    def first_one_taken() -> int:
        picks.append(taken.getsockname()[1] if not picks else real())
        return picks[-1]

    monkeypatch.setattr(launch, "free_port", first_one_taken)
    spec = load_workload(WORKLOADS / "cpu_allgather_matmul")
    try:
        rec = evaluate(spec, spec.seed_path, EvalOptions(device="cpu", max_level="L2", small_shapes=["odd"],
                                                         work_dir=tmp_path / "w"))
    finally:
        taken.close()
    assert rec.ok, rec.error
    assert len(picks) >= 3  # the taken judge port, then a new host port and judge port for the second attempt
