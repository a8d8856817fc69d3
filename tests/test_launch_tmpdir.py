"""The ranks' TMPDIR, where a program's processes meet by Unix sockets (torch's symmetric memory does): short
whatever the depth of the evaluation's folder (a socket's path past 107 bytes cannot be bound), and gone after."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import WORKLOADS

from cuco.runner import cascade
from cuco.runner.build.static_checks import StaticReport
from cuco.runner.cascade import EvalOptions, evaluate
from cuco.workload import load_workload

BINDS = '''import os, socket

def run(ctx):
    path = os.path.join(os.environ["TMPDIR"], "s" * 48)
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(path)
    raise ValueError("TMPDIR " + os.environ["TMPDIR"] + " bound")
'''


def test_a_socket_binds_in_tmpdir_under_a_deep_run_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(cascade, "check_source", lambda path: StaticReport(True, []))  # it imports socket
    src = tmp_path / "binds.py"
    src.write_text(BINDS)
    deep = tmp_path / ("run-directory-of-a-search" * 6) / "baselines" / "torch_async_tp" / "attempt-1796233874"
    spec = load_workload(WORKLOADS / "cpu_allgather_matmul")
    rec = evaluate(spec, src, EvalOptions(device="cpu", max_level="L2", small_shapes=["odd"], work_dir=deep))
    assert len(str(deep)) > 107 and not rec.ok
    found = re.search(r"TMPDIR (\S+) bound", rec.error or "")
    assert found, rec.error
    assert not Path(found.group(1)).exists()  # removed with the evaluation
