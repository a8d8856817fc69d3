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

from cuco.runner.sandbox import (
    ARCHES,
    JudgeState,
    candidate_uid,
    claim_uid,
    identity,
    judge_state,
    processes_of,
    state_changes,
    sweep_uid,
)
from cuco.runner.sandbox.processes import LEDGER

PROBE = textwrap.dedent('''
    import json, os, resource, threading
    from cuco.runner.sandbox.seccomp import install as _seccomp
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
    import ctypes, platform
    from cuco.runner.sandbox.seccomp import NUMBERS
    libc = ctypes.CDLL(None, use_errno=True)
    def sys_call(name, *args):
        def call():
            if libc.syscall(NUMBERS[name][0 if platform.machine() == "x86_64" else 1], *args) < 0:
                raise OSError(ctypes.get_errno(), "")
        return call
    attempt("a user namespace", sys_call("unshare", 0x10000000))
    attempt("a mount namespace", sys_call("unshare", 0x20000))
    attempt("clone into a new pid namespace", sys_call("clone", 0x20000000 | 17, 0, 0, 0, 0))
    attempt("io_uring", sys_call("io_uring_setup", 1, ctypes.create_string_buffer(120)))
    attempt("mount", sys_call("mount", b"none", b"/tmp", b"tmpfs", 0, None))
    attempt("keyrings", sys_call("keyctl", 0, -3, 0))
    attempt("bpf", sys_call("bpf", 0, ctypes.create_string_buffer(64), 64))
    attempt("clone3", sys_call("clone3", ctypes.create_string_buffer(88), 88))
    def fork():
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    attempt("fork", fork)
    def thread():
        t = threading.Thread(target=lambda: None)
        t.start()
        t.join()
    attempt("a thread", thread)
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
                   "own limits": "allowed", "own priority": "allowed", "own thread's affinity": "allowed",
                   "a user namespace": refused, "a mount namespace": refused,
                   "clone into a new pid namespace": refused, "io_uring": refused, "mount": refused,
                   "keyrings": refused, "bpf": refused, "clone3": "Function not implemented", "fork": "allowed",
                   "a thread": "allowed"}


def test_the_judge_sees_its_own_state_change():
    before = judge_state()
    assert state_changes(before, judge_state()) == []
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    niced = JudgeState({tid: (p, n + 1, cpus) for tid, (p, n, cpus) in before.threads.items()}, before.limits)
    assert state_changes(before, niced)[0].endswith(f"nice value {nice} -> {nice + 1}")
    limited = JudgeState(before.threads, {**before.limits, "RLIMIT_NOFILE": (16, 16)})
    assert state_changes(before, limited) == [f"RLIMIT_NOFILE {before.limits['RLIMIT_NOFILE']} -> (16, 16)"]


ROOT_WITH_SETUID = os.geteuid() == 0 and candidate_uid() is not None
as_root = pytest.mark.skipif(not ROOT_WITH_SETUID, reason="cuco gives the candidate a uid of its own only as root")

BECOME = textwrap.dedent('''
    import json, os, sys
    from pathlib import Path
    from cuco.runner.sandbox import identity
    uid, wanted, hidden = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    covered = identity.reach([wanted], uid)
    identity.become(uid, os.getppid())
    out = {"uid": os.getuid(), "covered": covered, "read": wanted.read_text()}
    try:
        out["hidden"] = hidden.read_text()
    except OSError as exc:
        out["hidden"] = exc.strerror
    try:
        open("/proc/sys/kernel/core_pattern", "w").close()
        out["core_pattern"] = "writable"
    except OSError as exc:
        out["core_pattern"] = exc.strerror
    print(json.dumps(out))
''')


@as_root
def test_an_unprivileged_uid_reads_what_it_must_and_nothing_beside_it(tmp_path):
    """A folder closed to others on the way (a Python in /root) is covered, in the process's own mount namespace, by
    one that holds only the entries on the way: the candidate's uid reads those, and not their neighbours."""
    closed = tmp_path / "home"
    (closed / "venv").mkdir(parents=True)
    (closed / "venv" / "lib.py").write_text("needed")
    (closed / "keys").write_text("secret")
    closed.chmod(0o700)
    uid = candidate_uid()
    proc = subprocess.run([sys.executable, "-c", BECOME, str(uid), str(closed / "venv" / "lib.py"),
                           str(closed / "keys")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    got = json.loads(proc.stdout)
    assert got["uid"] == uid and uid >= identity.UID_BASE
    assert got["read"] == "needed" and str(closed) in got["covered"]
    assert got["hidden"] == "No such file or directory"
    assert got["core_pattern"] == "Permission denied"
    assert (closed / "keys").read_text() == "secret" and closed.stat().st_mode & 0o777 == 0o700  # nothing changed


@as_root
def test_everything_of_the_candidates_uid_is_killed_wherever_it_is():
    uid = candidate_uid()
    detached = subprocess.Popen(["sleep", "600"], user=uid, group=uid, extra_groups=[], start_new_session=True)
    assert processes_of(uid) == [detached.pid]
    assert sweep_uid(uid) == []
    assert detached.wait(timeout=10) == -9


@as_root
def test_a_fork_storm_of_the_candidates_uid_is_killed():
    """A process that forks on and on, each child detaching and its parent going at once: a scan of /proc can find
    none of it at the instant it looks, but one kill(-1) as its uid reaches every process of the uid at once. The
    storm runs under a subreaper of its own, which reaps the dead (an init that does not would keep them as zombies)
    and leaves when none is left."""
    uid = candidate_uid()
    reaper = subprocess.Popen([sys.executable, "-c", STORM, str(uid)], stdout=subprocess.PIPE, text=True)
    try:
        assert reaper.stdout.readline() == "under way\n"
        assert sweep_uid(uid) == []
        assert reaper.wait(timeout=60) == 0
    finally:
        sweep_uid(uid)
        reaper.kill()


# Each shell starts the next in the background and leaves; the 100th closes the pipe: the storm is under way.
STORM = textwrap.dedent('''
    import ctypes, os, subprocess, sys
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: the storm's orphans come here
    uid = int(sys.argv[1])
    step = 'n=$((n+1)); export n; [ $n = 100 ] && exec 1>&-; /bin/sh -c "$STEP" & exit'
    storm = subprocess.Popen(["/bin/sh", "-c", step], user=uid, group=uid, extra_groups=[], stdout=subprocess.PIPE,
                             env={"STEP": step, "n": "0", "PATH": "/bin:/usr/bin"})
    storm.stdout.read()
    print("under way", flush=True)
    while True:  # until the sweep has killed every one and they are all reaped
        try:
            os.wait()
        except ChildProcessError:
            break
''')


@as_root
def test_a_uid_whose_launcher_is_gone_is_swept_when_the_next_is_claimed():
    """A launcher killed outright sweeps nothing: the next launch on the machine does, before its own candidate."""
    uid = candidate_uid()
    left = subprocess.Popen(["sleep", "600"], user=uid, group=uid, extra_groups=[], start_new_session=True)
    gone = subprocess.Popen(["true"])
    gone.wait()
    LEDGER.mkdir(mode=0o700, exist_ok=True)
    (LEDGER / str(uid)).write_text(f"{gone.pid} 1")
    mine = claim_uid(candidate_uid())
    try:
        assert left.wait(timeout=10) == -9 and not (LEDGER / str(uid)).exists()
        assert (LEDGER / str(mine)).read_text().split()[0] == str(os.getpid())
    finally:
        left.kill()
        assert sweep_uid(mine) == [] and not (LEDGER / str(mine)).exists()


@as_root
def test_only_a_candidates_uid_is_ever_swept(monkeypatch):
    """kill(-1) as root, or as a user's uid, would reach what is not the candidate's: a ledger entry naming one (the
    ledger is root's own, but the check does not rest on that) is passed over, and sweep_uid refuses it."""
    from cuco.runner.sandbox import SandboxError, processes

    with pytest.raises(SandboxError, match="not a candidate's"):
        sweep_uid(0)
    swept = []
    monkeypatch.setattr(processes, "sweep_uid", swept.append)
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = candidate_uid()
    LEDGER.mkdir(mode=0o700, exist_ok=True)
    for name in ("0", "1000", str(stale)):
        (LEDGER / name).write_text(f"{gone.pid} 1")
    mine = None
    try:
        mine = claim_uid(candidate_uid())
        assert swept == [stale]
    finally:
        for name in ("0", "1000", str(stale), str(mine)):
            (LEDGER / name).unlink(missing_ok=True)


def test_a_candidates_process_whose_judge_dies_as_it_starts_ends_too():
    """The judge killed as soon as it has forked its host, which then waits for a hello nobody sends: the host's
    parent-death signal is armed first thing in the child (candidate_handle._become_candidate_process), so nothing
    is left."""
    import select
    import socket

    ours, theirs = socket.socketpair()
    start = ("import os, sys\nfrom pathlib import Path\nfrom cuco.runner.processes import candidate_handle\n"
             "judge = os.getpid()\npid = os.fork()\n"
             "if pid == 0:\n    candidate_handle._become_candidate_process(int(sys.argv[1]), Path('.'), judge)\n"
             "print(pid, flush=True)\nos._exit(0)\n")
    judge = subprocess.run([sys.executable, "-c", start, str(theirs.fileno())], pass_fds=[theirs.fileno()],
                           capture_output=True, text=True, cwd=ROOT, check=True)
    theirs.close()
    try:
        gone = os.pidfd_open(int(judge.stdout))
    except ProcessLookupError:  # ended already
        return
    try:
        assert select.select([gone], [], [], 60)[0] == [gone], "the candidate's process outlived its judge"
    finally:
        os.close(gone)
        ours.close()


@as_root
def test_a_closed_folder_needed_itself_stays_whole_though_a_path_beneath_it_is_needed_too(tmp_path):
    """A checkout in a folder closed to others (mktemp -d): cuco's root is needed whole, its virtualenv beneath it
    too; the root must not shrink to the entries on the way to the virtualenv, whichever is listed first."""
    root = tmp_path / "checkout"
    (root / "venv" / "lib").mkdir(parents=True)
    (root / "cuco" / "kernels").mkdir(parents=True)
    root.chmod(0o700)
    uid = candidate_uid()
    for paths in ([root, root / "venv" / "lib"], [root / "venv" / "lib", root]):
        assert identity._closed_on_the_way(paths, uid)[root] == set()
