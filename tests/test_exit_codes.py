"""Every command run as a user runs it: from a folder of their own, with relative paths, and with exit codes a
script can rely on (docs/cli.md): 0 passed, 1 the candidate or the search failed, 2 bad input, 3 cuco's own
failure, 4 the machine lacks the GPUs asked for. Failures that are not the candidate's say whose they are."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import GEMM_AG, ROOT

CPU_WL = ROOT / "cuco" / "builtin" / "cpu_allgather_matmul"
QUICK = ["--set", "eval.iters=4", "--set", "eval.warmup=1", "--set", "search.rounds=0"]


def cuco(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """The installed command, started in `cwd` (never the checkout), CUCO_HOME relative to it."""
    full = {**os.environ, "CUCO_HOME": "home", "COLUMNS": "200", **env}
    full.pop("CUCO_WORKLOADS_PATH", None)
    return subprocess.run([sys.executable, "-m", "cuco", *args], cwd=cwd, env=full, capture_output=True, text=True,
                          timeout=600)


def said(proc: subprocess.CompletedProcess) -> str:
    return f"rc {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


def copy_workload(dest: Path) -> Path:
    shutil.copytree(CPU_WL, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def test_evolve_default_run_dir_is_relative_to_where_it_starts(tmp_path):
    """The README's first command, from a folder that is not the checkout: the default run directory and
    CUCO_HOME are relative, and the search ends with a passing best program."""
    proc = cuco(["evolve", "cpu_allgather_matmul", "--generations", "2", *QUICK], tmp_path)
    assert proc.returncode == 0, said(proc)
    run = tmp_path / "cuco-runs" / "cpu_allgather_matmul-cpu"
    record = json.loads((run / "best" / "record.json").read_text())
    assert record["ok"] and record["level_reached"] == "L4", record
    assert json.loads((run / "summary.json").read_text())["exit_code"] == 0
    assert (tmp_path / "home").is_dir() and not (ROOT / "home").exists()


def test_every_path_argument_may_be_relative(tmp_path):
    """Workload directory, candidate, --out, --config and the search.start it names (read from the config's
    folder), --run-dir, report's run directory and --out, init's --from and --dir, transform's workload."""
    copy_workload(tmp_path / "wl")
    (tmp_path / "cfg").mkdir()
    shutil.copy(tmp_path / "wl" / "seed.py", tmp_path / "cfg" / "start.py")
    (tmp_path / "cfg" / "run.toml").write_text('[search]\nstart = "start.py"\nrounds = 0\n[eval]\niters = 4\n'
                                            'warmup = 1\n')

    ev = cuco(["eval", "wl", "wl/seed.py", "--out", "rec.json", "--iters", "4", "--warmup", "1"], tmp_path)
    assert ev.returncode == 0 and json.loads((tmp_path / "rec.json").read_text())["ok"], said(ev)

    search = cuco(["evolve", "wl", "--config", "cfg/run.toml", "--generations", "1", "--run-dir", "runs/a"], tmp_path)
    assert search.returncode == 0, said(search)
    assert "started from" in (tmp_path / "runs" / "a" / "best" / "candidate.json").read_text()
    # the start program is the best: named by its file, not "None"
    assert "best: #1 start: start.py," in search.stdout, said(search)
    assert json.loads((tmp_path / "runs" / "a" / "summary.json").read_text())["best"]["label"] == "start: start.py"

    rep = cuco(["report", "runs/a", "--out", "page.html"], tmp_path)
    assert rep.returncode == 0 and "<html" in (tmp_path / "page.html").read_text().lower(), said(rep)

    shutil.copy(GEMM_AG / "seed.cu", tmp_path / "prog.cu")
    (tmp_path / "ws").mkdir()
    made = cuco(["init", "mine", "--from", "prog.cu", "--dir", "ws"], tmp_path)
    assert made.returncode == 0 and (tmp_path / "ws" / "mine" / "workload.toml").is_file(), said(made)
    pytest.importorskip("tree_sitter_cuda")
    seen = cuco(["transform", "ws/mine", "--analyze-only"], tmp_path)
    assert seen.returncode == 0 and "ncclAllGather" in seen.stdout, said(seen)


def test_ui_serves_a_relative_run_dir(tmp_path):
    """`cuco ui RUN_DIR` on a port: the page answers over HTTP, the search's table in it."""
    copy_workload(tmp_path / "wl")
    assert cuco(["evolve", "wl", "--generations", "1", "--run-dir", "run", *QUICK], tmp_path).returncode == 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "CUCO_HOME": "home"}
    server = subprocess.Popen([sys.executable, "-m", "cuco", "ui", "run", "--port", str(port)], cwd=tmp_path,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert "serving" in server.stdout.readline()  # printed once the socket listens
        import urllib.request

        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30).read().decode()
        assert "cpu_allgather_matmul" in page
    finally:
        server.kill()
        server.wait()


def test_missing_tool_is_cuco_failure_not_the_candidate(tmp_path):
    proc = cuco(["eval", str(GEMM_AG), "device_lsa", "--device", "cpu", "--out", "r.json"], tmp_path,
                CUCO_NVCC=str(tmp_path / "no-nvcc"))
    assert proc.returncode == 3, said(proc)
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["fault"] == "runner" and "missing nvcc" in record["error"] and "no-nvcc" in record["error"]
    assert "cuco's own failure" in proc.stdout


def test_unwritable_run_directory_stops_the_search_at_once(tmp_path):
    """Its evaluations' folder cannot be made (a file is in the way): cuco's failure, named in one line, after
    the first evaluation, not a search that spends its budget failing every candidate."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "evals").write_text("in the way")
    proc = cuco(["evolve", str(CPU_WL), "--generations", "4", "--run-dir", "run", *QUICK], tmp_path)
    assert proc.returncode == 3, said(proc)
    assert "cuco failed, not the candidates" in proc.stderr and "cannot write the candidate" in proc.stderr
    assert proc.stdout.count("done #") == 1, said(proc)
    # An unwritable run directory itself: one line before anything runs.
    (tmp_path / "file").write_text("")
    proc = cuco(["evolve", str(CPU_WL), "--run-dir", "file/run"], tmp_path)
    assert proc.returncode == 3 and proc.stderr.startswith("error: cuco's own failure:"), said(proc)
    assert len(proc.stderr.strip().splitlines()) == 1 and "cannot write the run directory" in proc.stderr


def test_host_start_up_failure_is_the_runners(tmp_path):
    """The candidate's process reports a failure before the candidate is loaded (its confinement cannot open a
    folder) as the runner's, so the judge does not blame the candidate."""
    from cuco.runner.processes.channel import Channel
    from cuco.runner.sandbox import landlock_abi

    if not landlock_abi():
        pytest.skip("the planted failure is Landlock's: this kernel has no Landlock")
    chan, child = Channel.pair()
    proc = subprocess.Popen([sys.executable, "-m", "cuco.runner.processes.candidate_process", str(child.fileno())],
                            pass_fds=[child.fileno()], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    child.close()
    chan.send("hello", fds=[], rank=0, world=1, candidate_language="python", device="cpu", candidate="x.py",
              library=None, harness=None, gpu=None, store_port=1, scratch=str(tmp_path / "gone"),
              tmp=str(tmp_path / "gone-too"))
    reply = chan.recv(timeout_s=60)
    assert proc.wait(timeout=60) == 3
    assert reply.kind == "error" and reply.data["framework"], reply.data
    assert reply.data["message"].startswith("cuco could not start the candidate's process"), reply.data


def test_broken_reference_is_the_workloads_fault(tmp_path):
    wl = copy_workload(tmp_path / "wl")
    ref = wl / "reference.py"
    text = ref.read_text()
    line = '    m, k = p["M"] // world, p["K"]\n    return {"a"'
    assert line in text  # the planted fault lands in make_inputs
    ref.write_text(text.replace(line, line.replace('p["K"]', 'p["Q"]'), 1))
    ev = cuco(["eval", "wl", "seed", "--out", "r.json"], tmp_path)
    assert ev.returncode == 2, said(ev)
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["fault"] == "workload" and "reference.py raised KeyError" in record["error"], record["error"]
    search = cuco(["evolve", "wl", "--generations", "3", "--run-dir", "run", *QUICK], tmp_path)
    assert search.returncode == 2 and "the workload failed, not the candidates" in search.stderr, said(search)


def test_search_without_a_passing_candidate_exits_1(tmp_path):
    wl = copy_workload(tmp_path / "wl")
    (tmp_path / "wrong.py").write_text((wl / "seed.py").read_text().replace(
        "torch.matmul(a_full, b, out=c)", "torch.matmul(a_full, b, out=c)\n    c.mul_(2)"))
    proc = cuco(["evolve", "wl", "--generations", "1", "--run-dir", "run", "--set", "search.start=wrong.py",
                 *QUICK], tmp_path)
    assert proc.returncode == 1 and "no candidate passed (1 evaluated" in proc.stderr, said(proc)
    assert not (tmp_path / "run" / "best").exists()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["exit_code"] == 1
    assert summary["start"]["ok"] is False and summary["start"]["label"] == "start: wrong.py"
    assert summary["start"]["failure"].startswith("the start program #1 (start: wrong.py) failed at L"), summary
    assert "warning: the start program #1 (start: wrong.py) failed at L" in proc.stdout, said(proc)


def test_a_search_whose_start_program_fails_says_so(tmp_path):
    """Other programs pass: the search exits 0 (docs/cli.md), and its summary says that the start failed, and why."""
    (tmp_path / "broken.py").write_text("def setup(ctx):\n    pass\n\n\ndef run(ctx)\n")
    proc = cuco(["evolve", str(CPU_WL), "--generations", "2", "--run-dir", "run", "--set", "search.start=broken.py",
                 *QUICK], tmp_path)
    assert proc.returncode == 0, said(proc)
    line = "the start program #1 (start: broken.py) failed at L1: Python syntax error: candidate.py:5:"
    assert f"warning: {line}" in proc.stdout, said(proc)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["exit_code"] == 0 and summary["best"]["id"] != 1
    assert summary["start"]["failed_level"] == "L1" and summary["start"]["failure"].startswith(line), summary


def test_a_missing_start_program_is_refused_before_the_run_directory_is_made(tmp_path):
    proc = cuco(["evolve", str(CPU_WL), "--run-dir", "run", "--set", "search.start=missing.cu"], tmp_path)
    assert proc.returncode == 2, said(proc)
    assert proc.stderr == f"error: search.start: {tmp_path / 'missing.cu'} does not exist\n", said(proc)
    assert not (tmp_path / "run").exists()


def test_search_whose_llm_is_unreachable_exits_1(tmp_path):
    """The endpoint refuses every connection: the seed is evaluated, then the proposer gives up and says so."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    (tmp_path / "run.toml").write_text(
        f'[search]\nproposer = "llm"\nnovelty = "off"\n[eval]\niters = 4\nwarmup = 1\n'
        f'[llm]\nprovider = "openai_compatible"\nmodel = "m"\nbase_url = "http://127.0.0.1:{port}/v1"\n'
        "max_retries = 0\nmax_consecutive_failures = 2\n")
    proc = cuco(["evolve", str(CPU_WL), "--config", "run.toml", "--generations", "4", "--run-dir", "run"], tmp_path)
    assert proc.returncode == 1, said(proc)
    assert "its proposer failed" in proc.stderr and proc.stdout.count("done #") == 1, said(proc)


def test_cuda_search_on_a_machine_without_gpus_exits_4(tmp_path):
    proc = cuco(["evolve", str(GEMM_AG), "--device", "cpu", "--run-dir", "run"], tmp_path)
    assert proc.returncode == 4, said(proc)
    assert proc.stderr.startswith("error: ") and "its programs are CUDA" in proc.stderr, said(proc)
    assert not (tmp_path / "run").exists()


@pytest.mark.nvcc
def test_cuda_eval_on_a_machine_without_gpus_says_built_only(tmp_path):
    proc = cuco(["eval", str(GEMM_AG), "device_lsa", "--device", "cpu", "--out", "r.json"], tmp_path)
    assert proc.returncode == 4, said(proc)
    assert "passed" not in proc.stdout and "reached L1 (built); L2-L4 need 2 GPUs" in proc.stdout, said(proc)
