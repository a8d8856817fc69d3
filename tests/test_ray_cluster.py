"""Searches on a Ray cluster (search.backend = ray): a real local cluster, a head and worker nodes each with a raylet
and resources of its own, runs `cuco evolve` on the CPU example. The driver keeps the store; each evaluation is a
task on a node, and a node killed in the middle of one loses nothing."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ray_cluster = pytest.importorskip("ray.cluster_utils", reason="the ray extra is not installed")

# Both tests start a cluster of their own: one xdist worker runs them, one after the other.
pytestmark = pytest.mark.xdist_group("ray")
DEADLINE_S = 300  # an evaluation of the CPU example takes seconds; this only bounds a broken run


@pytest.fixture
def cluster():
    c = ray_cluster.Cluster(initialize_head=True, head_node_args={"num_cpus": 0})  # the head runs no evaluation
    yield c
    c.shutdown()


def _evolve(address: str, run_dir: Path, evaluations: int, slots: int, *sets: str) -> list[str]:
    args = [sys.executable, "-m", "cuco", "evolve", "cpu_allgather_matmul", "--generations", str(evaluations),
            "--run-dir", str(run_dir), "--set", "search.backend=ray", "--set", f"ray.address={address}",
            "--set", f"search.slots={slots}", "--set", "search.rounds=0", "--set", "eval.iters=4",
            "--set", "eval.warmup=1"]
    for s in sets:
        args += ["--set", s]
    return args


def _stored(run_dir: Path) -> list[dict]:
    db = sqlite3.connect(run_dir / "cuco.db")
    rows = db.execute("SELECT id, status, record FROM candidates ORDER BY id").fetchall()
    return [{"id": i, "status": s, **(json.loads(r) if r else {})} for i, s, r in rows]


def test_a_search_runs_its_evaluations_on_every_node(cluster, tmp_path):
    cluster.add_node(num_cpus=2)  # the CPU example's world is 2: one evaluation per node at a time
    cluster.add_node(num_cpus=2)
    proc = subprocess.run(_evolve(cluster.address, tmp_path / "run", 2, 2), capture_output=True, text=True,
                          timeout=DEADLINE_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 slot(s) on a Ray cluster (cpu)" in proc.stdout
    rows = _stored(tmp_path / "run")
    assert len(rows) == 2 and all(r["status"] == "done" and r["ok"] for r in rows), rows
    assert len({r["node"]["node_id"] for r in rows}) == 2  # the two ran at once, one on each node
    assert (tmp_path / "run" / "best" / "candidate.py").is_file()


def _evaluation_running_on_a_node(since: float) -> bool:
    """A judge is running, and a cluster node started an evaluation since SINCE (its ranks' logs lie in the node's
    own directory)."""
    def fresh(log: Path) -> bool:
        try:
            return log.stat().st_mtime >= since
        except OSError:  # its node's directory went meanwhile
            return False

    if not any(fresh(log) for log in Path(tempfile.gettempdir()).glob("cuco-node-*/*/rank0.log")):
        return False
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() == "cuco-judge":
                return True
        except OSError:
            continue
    return False


def test_a_node_killed_mid_evaluation_loses_nothing(cluster, tmp_path):
    victim = cluster.add_node(num_cpus=2)
    run = tmp_path / "run"
    since = time.time() - 1  # a file's time is the file system's, coarser than the clock's
    proc = subprocess.Popen(_evolve(cluster.address, run, 2, 1), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline = time.monotonic() + DEADLINE_S
    while not _evaluation_running_on_a_node(since):
        assert proc.poll() is None and time.monotonic() < deadline, "no evaluation started on the node"
        time.sleep(0.05)
    cluster.remove_node(victim, allow_graceful=False)  # its raylet and workers are killed, the evaluation with them
    cluster.add_node(num_cpus=2)  # where Ray runs it again
    out, _ = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 0, out
    rows = _stored(run)
    assert [r["id"] for r in rows] == [1, 2] and all(r["status"] == "done" for r in rows), rows
    # The evaluation in flight ran again on the new node and was recorded once, like every other.
    assert all(r["ok"] for r in rows), [r.get("error") for r in rows]
    assert victim.unique_id not in {r["node"]["node_id"] for r in rows}
