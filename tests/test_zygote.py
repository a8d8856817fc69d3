"""The judges' zygote: a judge's exit code and output come back through it, a dead zygote is replaced, and a
launcher killed mid-evaluation leaves no zygote, judge or candidate's process behind."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT

from cuco.runner.processes.zygote_client import Judge, Zygote, zygote
from cuco.runner.sandbox.processes import descendants

DEADLOCK = ROOT / "tests" / "faults" / "deadlock.py"


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _fork(z: Zygote, job: Path, log: Path) -> Judge:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT, 0o600)
    read, write = os.pipe()
    os.close(write)
    try:
        return z.fork([str(job), "0"], {**os.environ, "PYTHONPATH": str(ROOT)}, str(log.parent), fd, read)
    finally:
        os.close(fd)
        os.close(read)


def test_a_judges_exit_code_and_output_come_back_and_a_dead_zygote_is_replaced(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = zygote(env)
    judge = _fork(first, tmp_path / "no_such_job.json", tmp_path / "rank0.log")
    assert judge.wait(timeout=60) == 1  # rank.main could not read its job
    log = (tmp_path / "rank0.log").read_text()
    assert "no_such_job.json" in log and "FileNotFoundError" in log, log
    first._proc.kill()
    first._proc.wait()
    second = zygote(env)
    assert second is not first
    assert _fork(second, tmp_path / "no_such_job.json", tmp_path / "again.log").wait(timeout=60) == 1


def test_a_killed_launcher_leaves_no_zygote_judge_or_candidate_behind(tmp_path):
    """SIGKILL to `cuco eval` while its candidate waits in a barrier: the zygote sees its socket close and exits,
    each judge dies with the zygote, each host with its judge."""
    launcher = subprocess.Popen([sys.executable, "-m", "cuco", "eval", "cpu_allgather_matmul", str(DEADLOCK),
                                 "--world", "2", "--device", "cpu"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 120
    try:
        while sum(_comm(p) == "cuco-host" for p in descendants(launcher.pid)) < 2:
            assert launcher.poll() is None and time.monotonic() < deadline, "no candidate's process started"
            time.sleep(0.05)
        tree = {p: _comm(p) for p in descendants(launcher.pid)}
        assert {"cuco-zygote", "cuco-judge", "cuco-host"} <= set(tree.values()), tree
        exited = {os.pidfd_open(p): p for p in tree}
    finally:
        launcher.kill()
        launcher.wait()
    left = set(exited)
    end = time.monotonic() + 30
    while left and time.monotonic() < end:
        left -= set(select.select(list(left), [], [], max(0.0, end - time.monotonic()))[0])
    survivors = [(exited[f], tree[exited[f]]) for f in left]
    for fd in exited:
        if fd in left:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        os.close(fd)
    assert not survivors, f"outlived their launcher: {survivors}"
