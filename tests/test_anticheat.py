"""Planted cheats (tests/anticheat/), run for real on two CPU ranks: each is caught at a named level with a
one-line reason, or, where the judge's isolation leaves it nothing to gain, it scores honestly. Most run twice:
as written (the static checks catch them at L0) and with the static checks switched off, so that the runtime
isolation is shown to hold on its own."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import GEMM_AG, ROOT

from cuco.runner import cascade
from cuco.runner.build.static_checks import StaticReport
from cuco.runner.cascade import EvalOptions, evaluate
from cuco.runner.sandbox import landlock_abi
from cuco.workload import load_workload

CHEATS = ROOT / "tests" / "anticheat"
CPU_WL = ROOT / "cuco" / "builtin" / "cpu_allgather_matmul"

REACH = ["Operation not permitted", "judge was reached from outside"]
# cheat: (level with the static checks on, words; level with them off, words)
CAUGHT = {
    "cache_outputs": (("L2", ["out of tolerance"]), ("L2", ["out of tolerance"])),
    "cache_after_checks": (("L4", ["a timed run's output is wrong"]), ("L4", ["a timed run's output is wrong"])),
    "stack_frames": (("L0", ["forbidden"]), ("L2", ["out of tolerance"])),
    "regenerate_inputs": (("L0", ["forbidden"]), ("L2", ["out of tolerance"])),
    "patch_verifier": (("L0", ["forbidden"]), ("L2", ["NaN/Inf"])),
    "shrink_buffers": (("L4", ["a timed run's output is wrong", "NaN/Inf"]),
                       ("L4", ["a timed run's output is wrong", "NaN/Inf"])),
    "exit_zero": (("L2", ["exited with status 0", "a candidate may not end its process"]),
                  ("L2", ["exited with status 0"])),
    "detached_process": (("L0", ["forbidden"]), None),  # with the checks off it passes: see its own test
    # its thread races the judge's delivery: a run where it sees the poison before the inputs land is computed from
    # stale inputs and fails; on a loaded machine the first such run may come at a later level
    "work_in_the_gap": (("L0", ["forbidden"]), ("L2|L3|L4", ["out of tolerance", "a timed run's output is wrong"])),
    "write_parameter": (("L2", ["parameter changed by the runs"]), ("L2", ["parameter changed by the runs"])),
    "zero_weights_for_reference": (("L2", ["parameter changed by the runs"]),
                                   ("L2", ["parameter changed by the runs"])),
    "swap_weights_while_verified": (("L2", ["out of tolerance"]), ("L2", ["out of tolerance"])),
    # every timed run is verified: the first one it skips is named (warm-up 1, so timed run 0 is its sixth run)
    "skip_half_the_runs": (("L4", ["a timed run's output is wrong: rank 0: timed run 0: "]),
                           ("L4", ["a timed run's output is wrong: rank 0: timed run 0: "])),
    # refused by the host's seccomp filter, or by the kernel (a judge with capabilities, root, to a host without);
    # where neither refuses (affinity passes the filter), the judge sees its own state change
    "reach_scheduler": (("L0", ["forbidden"]), ("L2|L4", REACH)),
    "reach_limits": (("L0", ["forbidden"]), ("L2|L4", REACH)),
    "reach_affinity": (("L0", ["forbidden"]), ("L2|L4", REACH)),
    # as root the candidate runs under a uid of its own; as any user Landlock and seccomp shut the rest
    "escape_the_sandbox": (("L0", ["forbidden"]), ("L2", ["NaN/Inf"])),
    # the loader reads the text the checks read, and refuses the declaration as they do
    "coding_cookie": (("L0", ["forbidden coding declaration 'utf-7'"]), ("L2", ["forbidden coding declaration"])),
}


def _opts(tmp_path, **kw) -> EvalOptions:
    base = dict(device="cpu", shapes=["s256"], small_shapes=["s_odd"], warmup=1, iters=6, work_dir=tmp_path / "w",
                timeout_s=60)
    base.update(kw)
    return EvalOptions(**base)


@pytest.fixture
def no_static_checks(monkeypatch):
    """The runtime alone: L0 passes everything (the cheats' forbidden imports included)."""
    monkeypatch.setattr(cascade, "check_source", lambda path: StaticReport(True, []))


def _assert_caught(rec: dict, level: str, words: list[str]) -> None:
    assert not rec.ok, "a cheat passed"
    assert rec.failed_level in level.split("|"), rec.error
    assert "\n" not in rec.error.strip()
    assert any(w in rec.error for w in words), rec.error


@pytest.mark.parametrize("name", sorted(CAUGHT))
def test_cheat_is_caught(name, tmp_path):
    (level, words), _ = CAUGHT[name]
    _assert_caught(evaluate(load_workload(GEMM_AG), CHEATS / f"{name}.py", _opts(tmp_path)), level, words)


@pytest.mark.parametrize("name", sorted(n for n, (_, off) in CAUGHT.items() if off and CAUGHT[n][0][0] == "L0"))
def test_cheat_is_caught_without_static_checks(name, tmp_path, no_static_checks):
    level, words = CAUGHT[name][1]
    _assert_caught(evaluate(load_workload(GEMM_AG), CHEATS / f"{name}.py", _opts(tmp_path)), level, words)


def test_scratch_and_outputs_are_poisoned_before_every_run(tmp_path):
    """A candidate that gathers only when the scratch is NaN is right only if every run, timed ones included,
    starts from poisoned scratch."""
    rec = evaluate(load_workload(GEMM_AG), CHEATS / "scratch_must_be_poisoned.py", _opts(tmp_path))
    assert rec.ok, rec.error
    assert rec.shapes["s256"].timing.verified_runs == list(range(6))


def test_weights_are_there_when_setup_runs(tmp_path):
    """A layout of the weights made once in setup (untimed, as serving engines do at load) is allowed and right, at
    every correctness stage. Not timed here: on a busy 2-core CPU the library bound (torch.matmul on the weights as
    given) came out 30-37 ms against this program's 8 ms, re-measured, in 2 of 4 full runs, and was called
    impossible; on GPUs the speed of light is the limit."""
    rec = evaluate(load_workload(GEMM_AG), CHEATS / "weights_laid_out_in_setup.py", _opts(tmp_path, max_level="L3"))
    assert rec.ok, rec.error


def test_a_patched_timer_changes_nothing(tmp_path, no_static_checks):
    """The clocks of the candidate's process are not the judge's: stopping them leaves the measured time as it is."""
    spec = load_workload(GEMM_AG)
    honest = evaluate(spec, spec.candidates["torch_host"], _opts(tmp_path / "h"))
    patched = evaluate(spec, CHEATS / "patch_timer.py", _opts(tmp_path / "p"))
    assert honest.ok and patched.ok, (honest.error, patched.error)
    # Against the honest run's fastest iteration: its median on a busy 2-core machine can be several times that.
    h, p = honest.shapes["s256"].timing.min_ms, patched.shapes["s256"].timing.median_ms
    assert p > 0.3 * h, (p, h)  # a clock that stood still would give 0


def test_nothing_the_candidate_starts_outlives_the_evaluation(tmp_path, no_static_checks):
    for old in Path("/dev/shm").glob("cuco-detached-*"):
        old.unlink()
    rec = evaluate(load_workload(GEMM_AG), CHEATS / "detached_process.py", _opts(tmp_path))
    assert rec.ok, rec.error
    left = list(Path("/dev/shm").glob("cuco-detached-*"))
    assert left, "the planted process did not start"
    for path in left:
        pid = int(path.read_text())
        path.unlink()
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.skipif(not landlock_abi(), reason="the kernel has no Landlock: the filesystem is not confined")
def test_store_baselines_and_results_are_not_writable_from_the_candidate(tmp_path, no_static_checks, monkeypatch):
    from cuco.paths import cuco_home

    monkeypatch.setenv("CUCO_HOME", str(tmp_path / "home"))  # its baselines file is not one: kept from other tests
    work = tmp_path / "w"
    baselines = cuco_home() / "baselines" / "gemm_allgather-w2-cpu.json"
    store = tmp_path / "run" / "cuco.db"
    for p in (baselines, store):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("original")
    targets = [str(baselines), str(store), str(work / "rank0.json"), str(tmp_path / "new_file")]
    src = tmp_path / "write_store.py"
    src.write_text((CHEATS / "write_store.py.in").read_text().replace("@TARGETS@", json.dumps(targets)))
    rec = evaluate(load_workload(GEMM_AG), src, _opts(tmp_path))
    assert rec.ok, rec.error
    assert "Landlock" in rec.sandbox, rec.sandbox
    assert baselines.read_text() == "original" and store.read_text() == "original"
    assert "forged" not in (work / "rank0.json").read_text()
    assert not (tmp_path / "new_file").exists()


def test_the_ranks_share_their_temporary_folder(tmp_path, no_static_checks):
    """Processes of one program find each other's sockets in TMPDIR (torch's symmetric memory does): every rank's
    is the same writable folder, outside everything the sandbox keeps read-only."""
    rec = evaluate(load_workload(GEMM_AG), CHEATS / "shared_tmp.py", _opts(tmp_path, max_level="L2"))
    assert rec.ok, rec.error


def test_the_seed_never_reaches_a_file_the_candidate_can_read_while_it_runs(tmp_path):
    """Job file and progress carry no seed; the result files get it only after the candidate's processes are gone."""
    rec = evaluate(load_workload(GEMM_AG),
                   ROOT / "cuco" / "builtin" / "gemm_allgather" / "candidates" / "torch_host.py",
                   _opts(tmp_path, max_level="L2"))
    assert rec.ok and isinstance(rec.seed, int)
    job = (tmp_path / "w" / "job.json").read_text()
    assert "seed" not in json.loads(job) and str(rec.seed) not in job
    assert str(rec.seed) not in (tmp_path / "w" / "rank0.progress").read_text()
    assert not list((tmp_path / "w").glob("host*")), "the candidate's scratch folder outlived it"


def test_a_temporary_work_folder_is_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    rec = evaluate(load_workload(GEMM_AG),
                   ROOT / "cuco" / "builtin" / "gemm_allgather" / "candidates" / "torch_host.py",
                   EvalOptions(device="cpu", small_shapes=["s_odd"], max_level="L2"))
    assert rec.ok, rec.error
    assert not list(tmp_path.glob("cuco-eval-*"))


def test_a_time_without_its_bound_is_a_failure(tmp_path):
    wl = tmp_path / "wl"
    subprocess.run(["cp", "-r", str(CPU_WL), str(wl)], check=True)
    ref = (wl / "reference.py").read_text()
    (wl / "reference.py").write_text(ref.replace("def compute_alone(", "def _compute_alone(")
                                     .replace("def comm_alone(", "def _comm_alone("))
    spec = load_workload(wl)
    rec = evaluate(spec, spec.seed_path, EvalOptions(device="cpu", warmup=1, iters=3, work_dir=tmp_path / "w"))
    assert not rec.ok and rec.failed_level == "L4"
    assert "no physical bound" in rec.error


def test_a_forging_seed_is_never_ranked_best(tmp_path):
    """A search started from a cheat: the cheat fails, honest strategy points are found and ranked."""
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "cuco", "evolve", str(CPU_WL), "--generations", "3", "--run-dir", str(run_dir),
            "--seed", "2", "--set", f"search.start={CHEATS / 'cache_after_checks.py'}", "--set", "eval.iters=5",
            "--set", "eval.warmup=1", "--set", "search.rounds=0"]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "CUCO_HOME": str(tmp_path / "home"), "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    con = sqlite3.connect(run_dir / "cuco.db")
    rows = con.execute("SELECT proposal_index, ok, code FROM candidates ORDER BY proposal_index").fetchall()
    best = con.execute("SELECT code FROM candidates WHERE ok = 1 ORDER BY score DESC LIMIT 1").fetchone()
    con.close()
    cheat = (CHEATS / "cache_after_checks.py").read_text()
    assert [ok for _, ok, code in rows if code == cheat] == [0]
    assert best is not None and best[0] != cheat
    best_file = next((run_dir / "best").glob("candidate.*"))
    assert "CORRECTNESS_RUNS" not in best_file.read_text()


def test_the_candidate_inherits_no_keys_and_not_the_judges_port(tmp_path, monkeypatch, no_static_checks):
    """What the candidate's process can see of its environment: it says so in its own error message."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-not-for-candidates")
    src = tmp_path / "env.py"
    src.write_text("import os\n\ndef run(ctx):\n    raise ValueError('ENV ' + ' '.join(sorted(os.environ)))\n")
    rec = evaluate(load_workload(GEMM_AG), src, _opts(tmp_path, max_level="L2"))
    assert not rec.ok and "ENV " in rec.error, rec.error
    for name in ("ANTHROPIC_API_KEY", "CUCO_JUDGE_PORT", "CUCO_JUDGE_TOKEN", "CUCO_HOME"):
        assert name not in rec.error
    assert "TMPDIR" in rec.error
