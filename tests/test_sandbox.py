"""The host's seccomp filter, tried for real in a child process: what it refuses on another process (its parent,
as the judge is the host's) and what it leaves a process to do to itself and its own threads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT

from cuco.runner.sandbox import ARCHES, JudgeState, judge_state, state_changes

PROBE = textwrap.dedent('''
    import json, os, resource, threading
    from cuco.runner.sandbox import _seccomp
    parent, out = os.getppid(), {"installed": _seccomp()}
    def attempt(name, call):
        try:
            call()
            out[name] = "allowed"
        except OSError as exc:
            out[name] = os.strerror(exc.errno)
    attempt("scheduler of the parent", lambda: os.sched_setscheduler(parent, os.SCHED_IDLE, os.sched_param(0)))
    attempt("limits of the parent", lambda: resource.prlimit(parent, resource.RLIMIT_NOFILE,
                                                             resource.getrlimit(resource.RLIMIT_NOFILE)))
    attempt("priority of the parent", lambda: os.setpriority(os.PRIO_PROCESS, parent, 1))
    attempt("priority of the user", lambda: os.setpriority(os.PRIO_USER, os.getuid(), 1))
    attempt("own scheduler", lambda: os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0)))
    attempt("own limits", lambda: resource.setrlimit(resource.RLIMIT_CORE, resource.getrlimit(resource.RLIMIT_CORE)))
    attempt("own priority", lambda: os.setpriority(os.PRIO_PROCESS, os.getpid(), 1))
    attempt("own thread's affinity", lambda: os.sched_setaffinity(threading.get_native_id(), os.sched_getaffinity(0)))
    print(json.dumps(out))
''')


@pytest.mark.skipif(os.uname().machine not in ARCHES, reason="no seccomp table for this machine")
def test_the_filter_keeps_a_process_from_others_scheduling_and_limits():
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=60)
    got = json.loads(proc.stdout)
    if not got.pop("installed"):
        pytest.skip("the kernel has no seccomp filters")
    refused = "Operation not permitted"
    assert got == {"scheduler of the parent": refused, "limits of the parent": refused,
                   "priority of the parent": refused, "priority of the user": refused, "own scheduler": "allowed",
                   "own limits": "allowed", "own priority": "allowed", "own thread's affinity": "allowed"}


def test_the_judge_sees_its_own_state_change():
    before = judge_state()
    assert state_changes(before, judge_state()) == []
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    niced = JudgeState({tid: (p, n + 1, cpus) for tid, (p, n, cpus) in before.threads.items()}, before.limits)
    assert state_changes(before, niced)[0].endswith(f"nice value {nice} -> {nice + 1}")
    limited = JudgeState(before.threads, {**before.limits, "RLIMIT_NOFILE": (16, 16)})
    assert state_changes(before, limited) == [f"RLIMIT_NOFILE {before.limits['RLIMIT_NOFILE']} -> (16, 16)"]
