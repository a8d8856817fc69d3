"""cuco evolve end to end: determinism, resuming after SIGKILL, and one-line errors for bad input."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import sqlite3
import subprocess
import sys

import pytest
from conftest import GEMM_AG, ROOT

from cuco.evolve.config import RunConfig
from cuco.evolve.run import Evolution
from cuco.evolve.slots import Slot
from cuco.runner.results.record import EvalRecord
from cuco.workload import load_workload

CPU_WL = ROOT / "cuco" / "builtin" / "cpu_allgather_matmul"


def fake_evaluator(spec, src, slot, work, name=None):
    """Deterministic scores from the code: the search's choices then depend on the seed alone."""
    h = int(hashlib.sha256(src.read_text().encode()).hexdigest()[:8], 16)
    ms = 0.5 + (h % 1000) / 1000
    ok = h % 7 != 0
    shape = "8k"
    return EvalRecord.from_dict({"ok": ok, "level_reached": "L4" if ok else "L2",
                                 "failed_level": None if ok else "L2", "error": None if ok else "planted failure",
                                 "shapes": {shape: {"timing": {"median_ms": ms}, "bound": {"bound_ms": 0.4}}}})


def _run(tmp_path, seed: int, generations: int = 14) -> list[str]:
    cfg = RunConfig()
    cfg.search.generations, cfg.search.seed, cfg.search.shape = generations, seed, "8k"
    evo = Evolution(load_workload(GEMM_AG), cfg, tmp_path, [Slot(0, ())], fake_evaluator, "cuda")
    asyncio.run(evo.run())
    labels = [c.label for c in evo.db.all()]
    assert evo.db.count("done") == generations
    evo.db.close()
    return labels


def test_same_seed_same_proposals(tmp_path):
    first = _run(tmp_path / "a", seed=7)
    assert first == _run(tmp_path / "b", seed=7)
    assert first != _run(tmp_path / "c", seed=8)
    assert len(set(first)) == len(first)  # no design point proposed twice


def test_phases_islands_and_best_written(tmp_path):
    _run(tmp_path, seed=3, generations=20)
    con = sqlite3.connect(tmp_path / "cuco.db")
    phases = [r[0] for r in con.execute("SELECT phase FROM candidates ORDER BY proposal_index")]
    assert phases[0] == "seed" and "explore" in phases and "exploit" in phases
    assert phases.index("exploit") > phases.index("explore")
    assert {r[0] for r in con.execute("SELECT island FROM candidates")} == {0, 1}
    assert con.execute("SELECT COUNT(*) FROM island_members").fetchone()[0] > 0  # migrations happened
    best_id = con.execute("SELECT id FROM candidates WHERE ok = 1 ORDER BY score DESC LIMIT 1").fetchone()[0]
    written = [p for p in (tmp_path / "best").glob("candidate.*") if p.suffix in (".cu", ".py")]  # strategies of both
    assert len(written) == 1 and written[0].read_text() == con.execute(
        "SELECT code FROM candidates WHERE id = ?", (best_id,)).fetchone()[0]


def _cuco(args, home, **kw):
    env = {**os.environ, "CUCO_HOME": str(home), "COLUMNS": "200"}
    return subprocess.Popen([sys.executable, "-m", "cuco", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


def _done_rows(db):
    con = sqlite3.connect(db)
    rows = con.execute("SELECT id, code_hash, finished_at FROM candidates WHERE status = 'done' ORDER BY id").fetchall()
    con.close()
    return rows


def test_resume_after_sigkill_keeps_finished_and_reaches_the_total(tmp_path):
    run_dir, home = tmp_path / "run", tmp_path / "home"
    args = ["evolve", str(CPU_WL), "--generations", "4", "--run-dir", str(run_dir), "--seed", "1",
            "--set", "eval.iters=5", "--set", "eval.warmup=1", "--set", "search.rounds=0"]
    proc = _cuco(args, home, start_new_session=True)
    for line in proc.stdout:  # blocks on the real output; no sleeping
        if line.startswith("start #3"):
            os.killpg(proc.pid, signal.SIGKILL)  # mid-evaluation of the third candidate
            break
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    before = _done_rows(run_dir / "cuco.db")
    assert len(before) == 2
    con = sqlite3.connect(run_dir / "cuco.db")
    assert con.execute("SELECT status FROM candidates WHERE id = 3").fetchone()[0] == "running"
    con.close()

    proc = _cuco(args, home)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    after = _done_rows(run_dir / "cuco.db")
    assert len(after) == 4  # the requested total, counting finished evaluations
    assert after[:2] == before  # finished ones kept untouched, never evaluated again
    assert len({h for _, h, _ in after}) == 4
    assert "start #1" not in out and "start #2" not in out and "start #3" in out
    assert (run_dir / "best" / "candidate.py").is_file() and (run_dir / "best" / "record.json").is_file()
    assert (run_dir / "config.json").is_file()


@pytest.mark.parametrize("args,words", [
    (["evolve", "no_such_workload"], ["no_such_workload"]),
    (["evolve", str(CPU_WL), "--bogus"], ["--bogus"]),
    (["evolve", str(CPU_WL), "--config", "CFG_BROKEN"], ["not valid TOML"]),
    (["evolve", str(CPU_WL), "--config", "CFG_UNKNOWN"], ["search.bogus", "unknown key"]),
    (["evolve", str(CPU_WL), "--config", "CFG_TYPE"], ["search.islands", "expected int"]),
    (["evolve", str(CPU_WL), "--config", "missing.toml"], ["missing.toml", "does not exist"]),
    (["evolve", str(CPU_WL), "--set", "search.nope=1"], ["unknown key"]),
    (["evolve", str(CPU_WL), "--set", "search.islands=abc"], ["search.islands", "expected int"]),
    (["evolve", str(CPU_WL), "--set", "search.selection=best"], ["search.selection"]),
    (["evolve", str(CPU_WL), "--shape", "huge"], ["huge"]),
    (["evolve", str(CPU_WL), "--set", "search.proposer=magic"], ["unknown proposer"]),
    (["evolve", str(CPU_WL), "--set", "search.proposer=llm"], ["no API key", "ANTHROPIC_API_KEY"]),
    (["evolve", str(CPU_WL), "--set", "search.proposer=llm", "--set", "llm.provider=openai_compatible"],
     ["base_url"]),
])
def test_evolve_bad_input_is_one_line(tmp_path, args, words):
    cfgs = {"CFG_BROKEN": "[search\n", "CFG_UNKNOWN": "[search]\nbogus = 1\n",
            "CFG_TYPE": "[search]\nislands = \"two\"\n"}
    real = []
    for a in args:
        if a in cfgs:
            (tmp_path / f"{a}.toml").write_text(cfgs[a])
            a = str(tmp_path / f"{a}.toml")
        real.append(a)
    real += ["--run-dir", str(tmp_path / "run")] if "--run-dir" not in real and real[1] != "no_such_workload" else []
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")}
    proc = subprocess.run([sys.executable, "-m", "cuco", *real], cwd=ROOT, capture_output=True, text=True,
                          env={**env, "CUCO_HOME": str(tmp_path / "home")})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_run_dir_of_another_workload_is_refused(tmp_path):
    cfg = RunConfig()
    cfg.search.generations, cfg.search.shape = 1, "8k"
    evo = Evolution(load_workload(GEMM_AG), cfg, tmp_path, [Slot(0, ())], fake_evaluator, "cuda")
    asyncio.run(evo.run())
    evo.db.close()
    proc = subprocess.run([sys.executable, "-m", "cuco", "evolve", str(CPU_WL), "--run-dir", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "CUCO_HOME": str(tmp_path / "h")})
    assert proc.returncode == 2 and "belongs to another run" in proc.stderr, proc.stderr


def test_slots_evaluate_in_parallel(tmp_path):
    """Two slots keep two evaluations in flight; each result is written as it lands."""
    import threading

    active, peak, calls, lock = [0], [0], [0], threading.Lock()
    both_running = threading.Barrier(2, timeout=30)  # the first two evaluations meet here: both in flight

    def evaluator(spec, src, slot, work, name=None):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
            calls[0] += 1
            first_two = calls[0] <= 2
        try:
            if first_two:
                both_running.wait()
            return fake_evaluator(spec, src, slot, work)
        finally:
            with lock:
                active[0] -= 1

    cfg = RunConfig()
    cfg.search.generations, cfg.search.shape = 6, "8k"
    evo = Evolution(load_workload(GEMM_AG), cfg, tmp_path, [Slot(0, (0, 1)), Slot(1, (2, 3))], evaluator, "cuda")
    asyncio.run(evo.run())
    assert peak[0] == 2 and evo.db.count("done") == 6
    evo.db.close()


def test_the_baselines_are_measured_once_in_the_run_and_the_best_is_compared_with_the_strongest(tmp_path):
    """The workload's other baselines at the search's shape, by name (their NCCL settings go by it), kept in the
    store: a resumed run does not time them again; the summary and the report name the strongest of them."""
    from rich.console import Console

    from cuco.evolve.database import Database
    from cuco.evolve.run import strongest_baseline
    from cuco.report.html import render_report
    from cuco.report.live import summary_table

    calls = []

    def evaluator(spec, src, slot, work, name=None):
        calls.append(name)
        if name == "host_two_stream":  # a strong baseline: faster than every fake candidate
            return EvalRecord.from_dict({"ok": True, "level_reached": "L4", "shapes": {
                "8k": {"timing": {"median_ms": 0.45}, "bound": {"bound_ms": 0.4}}}})
        return fake_evaluator(spec, src, slot, work)

    cfg = RunConfig()
    cfg.search.generations, cfg.search.shape, cfg.search.rounds = 4, "8k", 0
    spec = load_workload(GEMM_AG)
    evo = Evolution(spec, cfg, tmp_path, [Slot(0, ())], evaluator, "cuda")
    asyncio.run(evo.run())
    others = [b for b in spec.baselines if b != "seed"]
    assert [c for c in calls if c] == others  # the seed is candidate #1
    assert strongest_baseline(evo.db) == ("host_two_stream", 0.45)
    console = Console(record=True, width=220)
    console.print(summary_table(evo))
    text = console.export_text()
    assert "strongest baseline measured in this run: host_two_stream" in text
    best = evo.db.best()
    assert f"{0.45 / best.median_ms:.2f}x" in text
    evo.db.close()
    assert "the strongest baseline of this run (host_two_stream)" in render_report(tmp_path)

    calls.clear()
    cfg.search.generations = 6
    evo = Evolution(spec, cfg, tmp_path, [Slot(0, ())], evaluator, "cuda")
    asyncio.run(evo.run())
    assert [c for c in calls if c] == []  # resumed: the baselines are in the store already
    evo.db.close()
    db = Database(tmp_path / "cuco.db")
    assert set(db.get_meta("baselines")) == set(others)
    db.close()


def test_the_best_is_timed_against_its_rivals_in_alternating_rounds_and_a_killed_run_goes_on(tmp_path):
    """At the search's end: the best, the seed and the strongest baseline, one evaluation each per round, the order
    reversed every round; each time stored as it comes, so a run killed in the rounds times only what is left."""
    from cuco.evolve.run import comparisons

    calls: list[str] = []
    kill_at = [8]

    def evaluator(spec, src, slot, work, name=None):
        if "rounds" in work.parts:
            calls.append(work.parts[work.parts.index("rounds") + 1])
            if len(calls) == kill_at[0]:
                raise KeyboardInterrupt  # as a kill in the middle of round 3
        if name == "host_two_stream":
            return EvalRecord.from_dict({"ok": True, "level_reached": "L4", "shapes": {
                "8k": {"timing": {"median_ms": 0.45 * (1 + 0.001 * len(calls))}, "bound": {"bound_ms": 0.4}}}})
        rec = fake_evaluator(spec, src, slot, work)
        if src.read_text() == spec.seed_path.read_text():  # never the best: the seed is one of the two rivals
            rec = EvalRecord.from_dict({"ok": True, "level_reached": "L4", "shapes": {
                "8k": {"timing": {"median_ms": 2.0}, "bound": {"bound_ms": 0.4}}}})
        if rec.ok and "rounds" in work.parts:  # a machine that slows down through the rounds
            rec.shapes["8k"].timing.median_ms *= 1 + 0.001 * len(calls)
        return rec

    cfg = RunConfig()
    cfg.search.generations, cfg.search.shape, cfg.search.rounds = 5, "8k", 4
    spec = load_workload(GEMM_AG)
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(Evolution(spec, cfg, tmp_path, [Slot(0, ())], evaluator, "cuda").run())
    assert calls[:6] == ["best", "start", "baseline-host_two_stream", "baseline-host_two_stream", "start", "best"]
    evo = Evolution(spec, cfg, tmp_path, [Slot(0, ())], evaluator, "cuda")
    asyncio.run(evo.run())
    assert len(calls) == 12 + 1  # four rounds of three, and the one cut off timed again
    found, error = comparisons(evo.db)
    best = evo.db.best()
    assert error is None and [c.other for c in found] == ["the seed", "host_two_stream"]
    assert all(c.this == f"the best (#{best.id})" and len(c.this_ms) == 4 and c.low <= c.speedup <= c.high
               for c in found)
    assert found[1].verdict == "slower"  # 0.45 ms against the fake candidates' 0.5 ms and more
    evo.db.close()


def test_rounds_stopped_by_a_failure_say_so_and_a_resumed_run_tries_again(tmp_path):
    from cuco.evolve.run import comparisons

    fail = [True]

    def evaluator(spec, src, slot, work, name=None):
        if "rounds" in work.parts and name and fail[0]:
            fail[0] = False
            return EvalRecord.from_dict({"ok": False, "failed_level": "L2", "error": "address already in use"})
        rec = fake_evaluator(spec, src, slot, work)
        if src.read_text() == spec.seed_path.read_text():  # never the best: the seed is one of the two rivals
            rec = EvalRecord.from_dict({"ok": True, "level_reached": "L4", "shapes": {
                "8k": {"timing": {"median_ms": 2.0}, "bound": {"bound_ms": 0.4}}}})
        return rec

    cfg = RunConfig()
    cfg.search.generations, cfg.search.shape, cfg.search.rounds = 3, "8k", 2
    spec = load_workload(GEMM_AG)
    evo = Evolution(spec, cfg, tmp_path, [Slot(0, ())], evaluator, "cuda")
    asyncio.run(evo.run())
    found, error = comparisons(evo.db)
    assert found == [] and "round 1:" in error and "address already in use" in error
    evo.db.close()
    evo = Evolution(spec, cfg, tmp_path, [Slot(0, ())], evaluator, "cuda")
    asyncio.run(evo.run())
    found, error = comparisons(evo.db)
    assert error is None and len(found) == 2 and all(len(c.this_ms) == 2 for c in found)
    evo.db.close()


def test_a_start_program_is_labelled_by_its_name_and_is_not_the_seed_baseline(tmp_path):
    """The summary names the best by its label: a search.start program has its file's name, never None; and it is not
    taken for the workload's seed when the strongest baseline is chosen."""
    from cuco.evolve.run import strongest_baseline

    start = tmp_path / "mine.py"
    start.write_text("# my program\n")

    def evaluator(spec, src, slot, work, name=None):
        rec = fake_evaluator(spec, src, slot, work)
        if name is None and src.read_text() == "# my program\n":  # the start program, the fastest of all
            return EvalRecord.from_dict({"ok": True, "level_reached": "L4", "shapes": {
                "8k": {"timing": {"median_ms": 0.1}, "bound": {"bound_ms": 0.4}}}})
        return rec if name is None else EvalRecord.from_dict({"ok": False, "error": "not timed here"})

    cfg = RunConfig()
    cfg.search.generations, cfg.search.shape, cfg.search.start = 1, "8k", str(start)
    evo = Evolution(load_workload(GEMM_AG), cfg, tmp_path / "run", [Slot(0, ())], evaluator, "cuda")
    asyncio.run(evo.run())
    best = evo.db.best()
    assert best.id == 1 and best.label == "start: mine.py"
    assert strongest_baseline(evo.db) is None  # no baseline was timed; the start program is not one
    evo.db.close()
