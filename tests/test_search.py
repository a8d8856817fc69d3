"""The library's front door to a search (cuco.search), as a script or a benchmark calls it: nothing is written before
every input is checked, the search runs to its end in this process, and what it returns is what summary.json and a
later reading of the store say."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT

from cuco.errors import CucoError, ExitCode
from cuco.evolve.config import apply_overrides, load_config
from cuco.evolve.rundir import RunDir
from cuco.search import prepare_search, result_of, run_search
from cuco.workload import load_workload

CPU_WL = ROOT / "cuco" / "builtin" / "cpu_allgather_matmul"
QUICK = ["eval.iters=4", "eval.warmup=1", "search.rounds=0"]


def _config(*sets: str):
    return apply_overrides(load_config(None), [*QUICK, *sets])


@pytest.mark.parametrize("sets,where", [(("search.start=/nowhere/start.py",), "search.start"),
                                        (("eval.device=cuda",), "eval.device cuda"),
                                        (("search.shape=huge",), "huge")])
def test_a_refused_search_writes_nothing(tmp_path, sets, where, monkeypatch):
    monkeypatch.setattr("cuco.machine.gpu_count", lambda: 0)
    with pytest.raises(CucoError) as err:
        prepare_search(load_workload(CPU_WL), _config(*sets), tmp_path / "run")
    assert where in str(err.value)
    assert not (tmp_path / "run").exists()


def test_a_search_through_the_front_door(tmp_path):
    notes: list[str] = []
    events: list[str] = []
    search = prepare_search(load_workload(CPU_WL), _config("search.generations=2", "search.seed=0"),
                            tmp_path / "run", note=notes.append)
    assert search.run_dir == RunDir(tmp_path / "run") and search.shape == "cpu"
    assert "cpu_allgather_matmul, shape cpu, 2 evaluations" in search.headline()
    result = run_search(search, on_event=lambda e, evo: events.append(e.kind))
    assert result.exit_code == ExitCode.OK and result.error is None, result
    assert result.evaluations == 2 and events.count("done") == 2
    assert result.start is not None and result.start.ok and result.best is not None
    assert json.loads(search.run_dir.summary.read_text()) == json.loads(json.dumps(result.summary()))
    again = result_of(search.run_dir)  # read back from the store alone
    assert (again.best.id, again.evaluations, again.exit_code) == (result.best.id, 2, ExitCode.OK)
    assert search.run_dir.best_record.is_file() and search.run_dir.config.is_file()
    assert json.loads(search.run_dir.best_record.read_text())["ok"]
