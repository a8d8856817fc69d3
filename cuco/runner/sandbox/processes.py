"""The processes around a candidate: the judge's own state, kept out of the candidate's reach, and the end of
everything the candidate started.

The judge is a child subreaper, so every process the candidate starts, detached or not, stays its descendant; at
the end it stops the whole tree first (a stopped process cannot fork, so the tree stops growing) and then kills it.
Where the candidate runs under a uid of its own (identity.py), the launcher kills everything of that uid once the
judges are gone, whatever tree it is in.
"""

from __future__ import annotations

import os
import resource
import signal
import stat
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from cuco.runner.sandbox.identity import UID_BASE
from cuco.runner.sandbox.native import SandboxError, prctl

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 1, 4, 36  # <linux/prctl.h>
STOP_ROUNDS = 200  # scans of the tree; a few suffice for any tree that does not fork on and on
SWEEP_ROUNDS = 50  # kill(-1) as the uid reaches every process of it at once; more rounds only for a fork in flight
# Root's: each candidate uid handed out and not yet swept, with its launcher. /run, where it can, since a reboot
# (which ends every process) empties it.
LEDGER = Path("/run" if os.access("/run", os.W_OK) else tempfile.gettempdir()) / "cuco-candidate-uids"


@dataclass
class JudgeState:
    """What a process beside the judge could change to slow it down or make it fail: each thread's scheduling
    policy, nice value and CPUs, the process's resource limits, and its OOM score and autogroup nice value."""

    threads: dict[str, tuple[int, int, tuple[int, ...]]]
    limits: dict[str, tuple[int, int]]
    proc: dict[str, str] | None = None


def _proc_self(name: str) -> str:
    try:
        return Path("/proc/self", name).read_text().strip()
    except OSError:  # a kernel without autogroups
        return ""


def judge_state() -> JudgeState:
    threads = {}
    for entry in os.scandir("/proc/self/task"):
        tid = int(entry.name)
        try:
            threads[entry.name] = (os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid),
                                   tuple(sorted(os.sched_getaffinity(tid))))
        except OSError:  # the thread ended meanwhile
            continue
    limits = {name: resource.getrlimit(getattr(resource, name)) for name in dir(resource)
              if name.startswith("RLIMIT_")}
    proc = {"oom_score_adj": _proc_self("oom_score_adj"), "autogroup": _proc_self("autogroup").split(" nice ")[-1]}
    return JudgeState(threads, limits, proc)


def state_changes(before: JudgeState, after: JudgeState) -> list[str]:
    """What differs between two readings, for the threads present in both."""
    out = []
    for tid in sorted(set(before.threads) & set(after.threads)):
        (bp, bn, ba), (ap, an, aa) = before.threads[tid], after.threads[tid]
        what = [f"{name} {b} -> {a}" for name, b, a in (("scheduling policy", bp, ap), ("nice value", bn, an),
                                                        ("CPUs", _cpus(ba), _cpus(aa))) if b != a]
        if what:
            out.append(f"thread {tid}'s " + ", ".join(what))
    out += [f"{name} {value} -> {after.limits.get(name)}" for name, value in before.limits.items()
            if after.limits.get(name) != value]
    b, a = before.proc or {}, after.proc or {}
    out += [f"{name} {value} -> {a.get(name)}" for name, value in b.items() if a.get(name, value) != value]
    return out


def _cpus(cpus: tuple[int, ...]) -> str:
    return f"{len(cpus)} CPUs" if len(cpus) > 4 else str(cpus)


def guard_judge() -> None:
    """The judge's memory, descriptors and environment stay closed to processes without CAP_SYS_PTRACE, and the
    candidate's processes stay its descendants (orphans are re-parented to it instead of to init)."""
    prctl(PR_SET_DUMPABLE, 0)
    prctl(PR_SET_CHILD_SUBREAPER, 1)


def keep_private() -> None:
    """This process's memory closed to processes of its own uid (the launcher holds the judges' token; without Yama,
    a process of the same uid could read it through /proc/<pid>/mem)."""
    prctl(PR_SET_DUMPABLE, 0)


def end_as_child(body: Callable[[], int]) -> NoReturn:
    """A forked child's whole life: BODY's exit code, or 1 with its traceback printed. It never returns into the
    parent's code, and skips the interpreter's teardown (the parent's exit handlers and objects are not its own)."""
    code = 1
    try:
        code = body()
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def name_process(name: str) -> None:
    """What ps and top show for this process: a zygote's children share its command line, so each is named."""
    Path("/proc/self/comm").write_text(name[:15])  # the kernel keeps 15 characters (TASK_COMM_LEN)


def die_with_parent(parent: int) -> None:
    """The kernel kills this process when its parent dies (a no-op where prctl is missing)."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent and os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _parents() -> dict[int, int]:
    """Every process's parent, from /proc."""
    out = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                out[int(entry.name)] = int(Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return out


def descendants(of: int) -> list[int]:
    parents, out, frontier = _parents(), [], [of]
    while frontier:
        kids = [pid for pid, ppid in parents.items() if ppid in frontier]
        out += kids
        frontier = kids
    return out


def children(of: int) -> list[int]:
    """Direct children of a process, from /proc."""
    return [pid for pid, ppid in _parents().items() if ppid == of]


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def kill_descendants() -> int:
    """Stop every descendant of this (subreaper) process, then kill and reap them all; returns how many there were.
    A stopped process cannot fork (a signal pending aborts a fork in flight), so once a scan finds none that is not
    stopped, the tree is complete. A process that forks and leaves faster than /proc is read can stay ahead of
    the scans: after STOP_ROUNDS the tree is killed as found, and where the candidate has a uid of its own the
    launcher's sweep_uid ends the rest."""
    me, stopped = os.getpid(), set()
    for _ in range(STOP_ROUNDS):
        new = [pid for pid in descendants(me) if pid not in stopped]
        if not new:
            break
        for pid in new:
            _signal(pid, signal.SIGSTOP)
            stopped.add(pid)
    for pid in stopped:
        _signal(pid, signal.SIGKILL)
    while kids := children(me):  # the dead are reaped; their orphans come to this process, and are reaped next
        for pid in kids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
    return len(stopped)


def processes_of(uid: int) -> list[int]:
    """The live processes of UID (a zombie is dead already: its parent reaps it)."""
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid and Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[0] \
                        not in ("Z", "X"):
                    out.append(int(entry.name))
            except (OSError, IndexError):
                continue
    return out


def sweep_uid(uid: int) -> list[int]:
    """Kill every process of UID (the candidate's own, identity.py): a process of that uid calls kill(-1, SIGKILL),
    which reaches all of them at once, wherever they are in the process tree. The first kill comes before any scan: a
    storm of processes that each fork and exit at once can be between two of them whenever a scan looks. Returns
    the pids left (none); with none left, the uid leaves the ledger."""
    if not UID_BASE <= uid < 2 * UID_BASE:  # kill(-1) as any other uid (root's above all) reaches what is not ours
        raise SandboxError(f"uid {uid} is not a candidate's: not swept")
    for _ in range(SWEEP_ROUNDS):
        subprocess.run(["/bin/sh", "-c", "kill -9 -1"], user=uid, group=uid, extra_groups=[], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not processes_of(uid):
            (LEDGER / str(uid)).unlink(missing_ok=True)
            return []
    return processes_of(uid)


def _started(pid: int) -> str | None:
    """When process PID started (clock ticks after boot), which tells it from a later process given the same pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def claim_uid(uid: int) -> int:
    """Write UID in the ledger under this launcher before anything runs under it, and first sweep every uid whose
    launcher is gone: a launcher killed outright (SIGKILL, a lost machine session) never swept its candidate's, and a
    process of that uid that detached from the tree would run on, and meet a later candidate given the same uid."""
    LEDGER.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = LEDGER.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise SandboxError(f"{LEDGER} is not a folder of this user's alone: the candidates' uids are kept in it")
    for entry in LEDGER.iterdir():
        try:
            pid, started = entry.read_text().split()
        except (OSError, ValueError):
            pid, started = "0", ""
        if entry.name.isdigit() and UID_BASE <= int(entry.name) < 2 * UID_BASE and _started(int(pid)) != started:
            sweep_uid(int(entry.name))
    (LEDGER / str(uid)).write_text(f"{os.getpid()} {_started(os.getpid())}")
    return uid


def remove_shm_files(pids: list[int]) -> None:
    """CUDA and torch name their /dev/shm files after the process (cuda.shm.<device>.<pid in hex>.<n>,
    torch_<pid>_<n>_<n>): a process that is killed, or that ends with os._exit as the judge does, leaves them."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        return
    for pid in pids:
        for pattern in (f"cuda.shm.*.{pid:x}.*", f"torch_{pid}_*"):
            for path in shm.glob(pattern):
                path.unlink(missing_ok=True)
