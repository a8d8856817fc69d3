"""What confines a candidate's process, and what keeps the judge out of its reach (Linux).

The candidate runs in a process of its own (the host), started by its rank's judge. Before any of the candidate's
code is loaded the host confines itself, in this order:
- identity.py: as root, what it must read made reachable (a mount namespace of its own), then an unprivileged uid
  of the evaluation's own; as an ordinary user, that user.
- capabilities: bounding, ambient, permitted and effective sets emptied, no_new_privs: nothing regained by exec.
- landlock.py: the filesystem read-only but for its scratch folders, its own /proc entries and GPU device files.
- seccomp.py: no way into another process, no namespaces, io_uring, userfaultfd, perf, bpf, keyrings or mounts.
processes.py holds the judge's side: its own state checked around every timed run, the subreaper, and the end of
everything the candidate started.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

from cuco.runner.sandbox import identity, seccomp
from cuco.runner.sandbox.identity import candidate_runs_as, candidate_uid
from cuco.runner.sandbox.landlock import landlock_abi, restrict, system_writable
from cuco.runner.sandbox.native import SandboxError, libc, prctl
from cuco.runner.sandbox.processes import (
    JudgeState,
    claim_uid,
    die_with_parent,
    end_as_child,
    guard_judge,
    judge_state,
    keep_private,
    kill_descendants,
    name_process,
    processes_of,
    remove_shm_files,
    state_changes,
    sweep_uid,
)
from cuco.runner.sandbox.seccomp import ARCHES, seccomp_available

__all__ = ["ARCHES", "Confinement", "JudgeState", "SandboxError", "candidate_runs_as", "candidate_uid", "claim_uid",
           "confine", "die_with_parent", "end_as_child", "guard_judge", "judge_state", "keep_private",
           "kill_descendants", "landlock_abi", "name_process", "processes_of", "remove_shm_files", "seccomp_available",
           "state_changes", "sweep_uid"]

PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4  # <linux/prctl.h>
LINUX_CAPABILITY_VERSION_3 = 0x20080522  # <linux/capability.h>: version 3 of the capset header, two words per set


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


@dataclass
class Confinement:
    """What the host could apply; written into every record so a reader knows what protected the run."""

    landlock_abi: int  # 0: none (the filesystem was writable to the candidate)
    capabilities_dropped: bool
    signal_scoped: bool
    seccomp: bool = False
    uid: int = -1  # the uid the candidate ran under
    own_uid: bool = False  # a uid of the evaluation's own (cuco runs as root)
    covered: int = 0  # folders closed to others made reachable in the host's mount namespace

    def describe(self) -> str:
        who = (f"uid {self.uid}, the evaluation's own" if self.own_uid else
               "uid 0: cuco runs as root without CAP_SETUID, so Landlock alone keeps root's files closed"
               if self.uid == 0 else f"uid {self.uid}, cuco's own user")
        fs = (f"Landlock ABI {self.landlock_abi}: filesystem read-only but for its scratch folders, its own /proc "
              "entries and the GPU's device files") if self.landlock_abi \
            else "no Landlock: the filesystem was writable to the candidate"
        caps = "no capabilities" if self.capabilities_dropped else "capabilities kept"
        reach = "seccomp: no ptrace, namespaces, io_uring, userfaultfd, perf, bpf, keyrings or mounts; no " \
                "scheduling or limits but its own" if self.seccomp \
            else "no seccomp filter: the judge's own checks alone kept it from its judge's scheduling"
        return f"{who}; {fs}; {caps}; {reach}" + ("; signals confined" if self.signal_scoped else "")


def _drop_bounding_set() -> None:
    cap_last = Path("/proc/sys/kernel/cap_last_cap")
    last = int(cap_last.read_text()) if cap_last.is_file() else 40  # 40 = CAP_CHECKPOINT_RESTORE, Linux 5.9
    for cap in range(last + 1):
        prctl(PR_CAPBSET_DROP, cap)  # EPERM without CAP_SETPCAP: then the set was already empty
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)


def _drop_capabilities() -> bool:
    _drop_bounding_set()
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    header, data = _CapHeader(LINUX_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        raise SandboxError(f"capset: {os.strerror(ctypes.get_errno())}")
    return True


def confine(*writable: Path, uid: int | None = None, parent: int = 0, readable: list[Path] = ()) -> Confinement:
    """Confine this process (the candidate's host) for the rest of its life; call before loading the candidate.
    WRITABLE: its scratch folders. UID (as root): the unprivileged uid to become, after making READABLE (what it
    must still read: Python, cuco, torch) reachable to it. PARENT: the judge, whose death must end this process."""
    covered: list[str] = []
    if uid is not None:
        for path in writable:  # its own first: a folder it owns is open to it, and never covered
            os.chown(path, uid, uid)
        covered = identity.reach(list(readable), uid)
        _drop_bounding_set()  # needs CAP_SETPCAP, which the uid change takes away
        identity.become(uid, parent)
    abi = landlock_abi()
    scoped = restrict([*map(Path, writable), *system_writable()], abi) if abi else False
    caps = _drop_capabilities()
    return Confinement(abi, caps, scoped, seccomp.install(), os.getuid(), uid is not None, len(covered))
