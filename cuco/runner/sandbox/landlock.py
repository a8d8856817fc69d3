"""Landlock (Linux 5.13+, unprivileged): the candidate's filesystem read-only but for a short list.

Writable: the host's scratch folder, the temporary folder its evaluation's ranks share, the host's own /proc
entries (/proc/<pid>: thread names, its own limits), and of /dev only what a GPU program opens for writing
(/dev/shm, the null and random devices, the GPU's and NIC's device files). Everything else, /proc/sys (a
core_pattern would start a helper as root outside every sandbox), other processes' /proc entries (the judge's
oom_score_adj and autogroup, the launcher's memory) and raw disks among them, stays read-only whatever the uid.
Signals to processes outside the sandbox are refused where the kernel supports it (ABI 6).
"""

from __future__ import annotations

import ctypes
import glob
import os
from pathlib import Path

from cuco.runner.sandbox.native import SandboxError, libc, prctl

# <asm-generic/unistd.h>: the Landlock syscalls have the same numbers on x86_64 and aarch64.
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
LANDLOCK_SCOPE_SIGNAL = 1 << 1  # ABI 6
PR_SET_NO_NEW_PRIVS = 38  # <linux/prctl.h>

# <linux/landlock.h> filesystem rights, and the ABI version that introduced each.
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_ABI1 = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15  # ABI 2, 3, 5
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
READ_ONLY = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR

# What of /dev a CUDA, NCCL or Triton program opens for writing: shared memory, the null and random devices, the
# GPU's device files (nvidia0.., nvidiactl, nvidia-uvm, nvidia-caps/) and RDMA NICs' (infiniband/).
DEVICE_FILES = ("/dev/shm", "/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/nvidia*",
                "/dev/infiniband")


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # __attribute__((packed)) in <linux/landlock.h>
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where Landlock is missing or disabled."""
    v = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                     ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    return max(0, int(v))


def system_writable() -> list[Path]:
    """The paths outside its own folders that a candidate's process may write: its own /proc entries and the device
    files above that exist on this machine."""
    found = [Path(p) for pattern in DEVICE_FILES for p in sorted(glob.glob(pattern))]
    return [*found, Path(f"/proc/{os.getpid()}")]


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
        if libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(attr), 0) != 0:
            raise SandboxError(f"landlock_add_rule({path}): {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


def restrict(writable: list[Path], abi: int) -> bool:
    """Everything read-only but WRITABLE, for the rest of this process's life; whether signals are confined too."""
    handled = _handled(abi)
    scoped = LANDLOCK_SCOPE_SIGNAL if abi >= 6 else 0
    attr = _RulesetAttr(handled, 0, scoped)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8  # the struct grew with the ABI
    ruleset = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise SandboxError(f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    try:
        _add_rule(ruleset, Path("/"), READ_ONLY & handled)
        for path in writable:
            _add_rule(ruleset, path, handled)
        if prctl(PR_SET_NO_NEW_PRIVS, 1) != 0:
            raise SandboxError(f"PR_SET_NO_NEW_PRIVS: {os.strerror(ctypes.get_errno())}")
        if libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            raise SandboxError(f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(ruleset)
    return bool(scoped)
