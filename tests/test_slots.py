"""Evaluation slots: disjoint GPU groups of one machine, or CPU process groups."""

from __future__ import annotations

import pytest

from cuco.evolve.slots import make_slots


def test_two_slots_on_a_four_gpu_box(monkeypatch):
    monkeypatch.setattr("cuco.machine.gpu_count", lambda: 4)
    slots = make_slots("cuda", 2)
    assert [s.gpus for s in slots] == [(0, 1), (2, 3)]
    assert [s.gpus for s in make_slots("cuda", 2, requested=1)] == [(0, 1)]
    assert [s.gpus for s in make_slots("cuda", 4)] == [(0, 1, 2, 3)]


def test_too_few_gpus(monkeypatch):
    monkeypatch.setattr("cuco.machine.gpu_count", lambda: 1)
    with pytest.raises(ValueError, match="needs 2 GPUs"):
        make_slots("cuda", 2)


def test_cpu_slots(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert len(make_slots("cpu", 2)) == 4 and make_slots("cpu", 2)[0].gpus == ()
    assert len(make_slots("cpu", 2, requested=1)) == 1
