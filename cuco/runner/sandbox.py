"""What confines a candidate's process, and what keeps the judge out of its reach (Linux).

The candidate runs in a process of its own (the host), started by its rank's judge. Before any of the
candidate's code is loaded the host confines itself:
- Landlock (Linux 5.13+, unprivileged): the whole filesystem becomes read-only except /dev (GPU device
  files, /dev/shm for NCCL), /proc (CUDA's initialisation fails without it; other processes' entries
  stay closed by the kernel's own checks, below), the host's own scratch folder and the temporary folder
  the evaluation's ranks share, so the run directory, the search's store, the baselines and CUCO_HOME
  cannot be written; signals to processes outside the sandbox are refused where the kernel supports it
  (Landlock ABI 6).
- no capabilities (bounding set, ambient and effective sets emptied, no_new_privs): even as root the host
  can neither ptrace nor read the judge's memory (the judge is not dumpable), nor regain them by exec.
The judge makes itself a child subreaper, so every process the candidate starts, detached or not, stays
its descendant and is killed when the evaluation ends.
"""

from __future__ import annotations

import ctypes
import os
import signal
from dataclasses import dataclass
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

# <linux/prctl.h>
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 36, 38, 47, 4
# <linux/capability.h>: version 3 of the capset header, two 32-bit words per set.
LINUX_CAPABILITY_VERSION_3 = 0x20080522
# <asm-generic/unistd.h>: the Landlock syscalls have the same numbers on x86_64 and aarch64.
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
LANDLOCK_SCOPE_SIGNAL = 1 << 1  # ABI 6

# <linux/landlock.h> filesystem rights, and the ABI version that introduced each.
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_ABI1 = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15  # ABI 2, 3, 5
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
READ_ONLY = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # __attribute__((packed)) in <linux/landlock.h>
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


class SandboxError(RuntimeError):
    pass


@dataclass
class Confinement:
    """What the host could apply; written into every record so a reader knows what protected the run."""

    landlock_abi: int  # 0: none (the filesystem was writable to the candidate)
    capabilities_dropped: bool
    signal_scoped: bool

    def describe(self) -> str:
        fs = f"Landlock ABI {self.landlock_abi}: filesystem read-only but for /dev, /proc and its scratch folder" \
            if self.landlock_abi else "no Landlock: the filesystem was writable to the candidate"
        caps = "no capabilities" if self.capabilities_dropped else "capabilities kept"
        return f"{fs}; {caps}" + ("; signals confined" if self.signal_scoped else "")


def _prctl(option: int, arg: int = 0) -> int:
    return _libc.prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where Landlock is missing or disabled."""
    v = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                      ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    return max(0, int(v))


def _handled(abi: int) -> int:
    rights = FS_ABI1
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def _add_rule(ruleset: int, path: Path, access: int) -> None:
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        if not path.is_dir():
            access &= FILE_RIGHTS
        attr = _PathBeneathAttr(access, fd)
        if _libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(attr), 0) != 0:
            raise SandboxError(f"landlock_add_rule({path}): {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


def _landlock(writable: list[Path], abi: int) -> bool:
    handled = _handled(abi)
    scoped = LANDLOCK_SCOPE_SIGNAL if abi >= 6 else 0
    attr = _RulesetAttr(handled, 0, scoped)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8  # the struct grew with the ABI
    ruleset = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise SandboxError(f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    try:
        _add_rule(ruleset, Path("/"), READ_ONLY & handled)
        for path in writable:
            _add_rule(ruleset, path, handled)
        if _prctl(PR_SET_NO_NEW_PRIVS, 1) != 0:
            raise SandboxError(f"PR_SET_NO_NEW_PRIVS: {os.strerror(ctypes.get_errno())}")
        if _libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            raise SandboxError(f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(ruleset)
    return bool(scoped)


def _drop_capabilities() -> bool:
    cap_last = Path("/proc/sys/kernel/cap_last_cap")
    last = int(cap_last.read_text()) if cap_last.is_file() else 40  # 40 = CAP_CHECKPOINT_RESTORE, Linux 5.9
    for cap in range(last + 1):
        _prctl(PR_CAPBSET_DROP, cap)  # EPERM without CAP_SETPCAP: then the set was already empty
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    header, data = _CapHeader(LINUX_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    if _libc.capset(ctypes.byref(header), data) != 0:
        raise SandboxError(f"capset: {os.strerror(ctypes.get_errno())}")
    return True


SYSTEM_WRITABLE = (Path("/dev"), Path("/proc"))


def confine(*writable: Path) -> Confinement:
    """Confine this process (the candidate's host) for the rest of its life, writing only beneath WRITABLE (its
    scratch folders) and SYSTEM_WRITABLE; call before loading the candidate."""
    abi = landlock_abi()
    scoped = _landlock([*map(Path, writable), *SYSTEM_WRITABLE], abi) if abi else False
    return Confinement(abi, _drop_capabilities(), scoped)


def guard_judge() -> None:
    """The judge's memory, descriptors and environment stay closed to processes without CAP_SYS_PTRACE, and the
    candidate's processes stay its descendants (orphans are re-parented to it instead of to init)."""
    _prctl(PR_SET_DUMPABLE, 0)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)


def die_with_parent(parent: int) -> None:
    """The kernel kills this process when its parent dies (a no-op where prctl is missing)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent and os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def children(of: int) -> list[int]:
    """Direct children of a process, from /proc."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == of:
            out.append(int(entry.name))
    return out


def kill_descendants() -> int:
    """SIGKILL every descendant of this (subreaper) process until none is left; returns how many were killed."""
    me, killed = os.getpid(), 0
    for _ in range(100):  # each round kills a generation; orphans re-parent to us for the next
        kids = children(me)
        if not kids:
            return killed
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        for pid in kids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
    return killed


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
