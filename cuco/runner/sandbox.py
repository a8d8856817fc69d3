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
- a seccomp filter (Linux 3.17+, unprivileged once no_new_privs is set): ptrace and process_vm_* refused
  outright; scheduling policy, priority and resource limits only for the host itself (a pid of 0 or its own),
  so a candidate cannot slow its judge down, starve it of a core or lower its limits. Affinity calls name
  threads by their own ids (NCCL and OpenMP pin their threads so), so they pass the filter: the judge checks
  its own affinity, scheduling and limits around every timed run instead (judge_state below).
The judge makes itself a child subreaper, so every process the candidate starts, detached or not, stays
its descendant and is killed when the evaluation ends.
"""

from __future__ import annotations

import ctypes
import errno
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
    seccomp: bool = False

    def describe(self) -> str:
        fs = f"Landlock ABI {self.landlock_abi}: filesystem read-only but for /dev, /proc and its scratch folder" \
            if self.landlock_abi else "no Landlock: the filesystem was writable to the candidate"
        caps = "no capabilities" if self.capabilities_dropped else "capabilities kept"
        reach = "seccomp: no ptrace, no scheduling or limits but its own" if self.seccomp \
            else "no seccomp filter: the judge's own checks alone kept it from its judge's scheduling"
        return f"{fs}; {caps}; {reach}" + ("; signals confined" if self.signal_scoped else "")


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


# ---- seccomp: nothing of the judge's within reach ---------------------------------------------------------
# <linux/seccomp.h>, <linux/filter.h>, <linux/audit.h>
SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC = 1, 1
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x06
SECCOMP_NR, SECCOMP_ARCH, SECCOMP_ARGS = 0, 4, 16  # offsets in struct seccomp_data; each arg is 8 bytes
X32_SYSCALL_BIT = 0x40000000


@dataclass(frozen=True)
class _Arch:
    audit: int  # AUDIT_ARCH_*
    seccomp: int  # the seccomp(2) syscall's number
    refused: tuple[int, ...]  # ptrace, process_vm_readv, process_vm_writev
    own_pid_arg0: tuple[int, ...]  # sched_setparam, sched_setscheduler, sched_setattr, prlimit64
    setpriority: int
    ioprio_set: int


# Syscall numbers from <asm/unistd_64.h> (x86_64) and <asm-generic/unistd.h> (aarch64).
ARCHES = {
    "x86_64": _Arch(0xC000003E, 317, (101, 310, 311), (142, 144, 314, 302), 141, 251),
    "aarch64": _Arch(0xC00000B7, 277, (117, 270, 271), (118, 119, 274, 261), 140, 30),
}


def _filter(arch: _Arch, pid: int) -> list[tuple[int, int, int, int]]:
    """The BPF program: (code, jump if true, jump if false, k), jumps relative to the next instruction."""
    deny, allow = ("ret", SECCOMP_RET_ERRNO | errno.EPERM), ("ret", SECCOMP_RET_ALLOW)
    own = [("ld", SECCOMP_ARGS), ("jeq", 0, "allow"), ("jeq", pid, "allow"), deny]  # arg at SECCOMP_ARGS
    prog: list[tuple] = [("ld", SECCOMP_ARCH), ("jne", arch.audit, "deny"), ("ld", SECCOMP_NR)]
    if arch.audit == ARCHES["x86_64"].audit:
        prog.append(("jge", X32_SYSCALL_BIT, "deny"))  # x32 numbers would bypass the table below
    prog += [("jeq", nr, "deny") for nr in (*arch.refused, arch.ioprio_set)]
    prog += [("jeq", nr, "own0") for nr in arch.own_pid_arg0]
    prog += [("jeq", arch.setpriority, "prio"), allow]
    labels = {"own0": len(prog)}
    prog += own
    labels["prio"] = len(prog)  # setpriority(which, who): only PRIO_PROCESS (0), only itself
    prog += [("ld", SECCOMP_ARGS), ("jne", 0, "deny"), ("ld", SECCOMP_ARGS + 8), ("jeq", 0, "allow"),
             ("jeq", pid, "allow"), deny]
    labels["deny"], labels["allow"] = len(prog), len(prog) + 1
    prog += [deny, allow]
    out = []
    for i, ins in enumerate(prog):
        if ins[0] == "ld":
            out.append((BPF_LD_W_ABS, 0, 0, ins[1]))
        elif ins[0] == "ret":
            out.append((BPF_RET_K, 0, 0, ins[1]))
        else:
            jump = labels[ins[2]] - i - 1
            code = BPF_JGE_K if ins[0] == "jge" else BPF_JEQ_K
            out.append((code, 0, jump, ins[1]) if ins[0] == "jne" else (code, jump, 0, ins[1]))
    return out


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def seccomp_available() -> bool:
    """Whether this machine can install the host's filter (a table for its architecture, filters in its kernel)."""
    PR_GET_SECCOMP = 21  # <linux/prctl.h>
    return os.uname().machine in ARCHES and _prctl(PR_GET_SECCOMP) >= 0


def _seccomp() -> bool:
    """Install the filter on every thread of this process; False where the architecture or kernel has none."""
    arch = ARCHES.get(os.uname().machine)
    if arch is None:
        return False
    prog = _filter(arch, os.getpid())
    insns = (_SockFilter * len(prog))(*[_SockFilter(*ins) for ins in prog])
    fprog = _SockFprog(len(prog), insns)
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    if _libc.syscall(arch.seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, ctypes.byref(fprog)) != 0:
        err = ctypes.get_errno()
        if err in (errno.ENOSYS, errno.EINVAL):  # a kernel built without seccomp filters
            return False
        raise SandboxError(f"seccomp: {os.strerror(err)}")
    return True


SYSTEM_WRITABLE = (Path("/dev"), Path("/proc"))


def confine(*writable: Path) -> Confinement:
    """Confine this process (the candidate's host) for the rest of its life, writing only beneath WRITABLE (its
    scratch folders) and SYSTEM_WRITABLE; call before loading the candidate."""
    abi = landlock_abi()
    scoped = _landlock([*map(Path, writable), *SYSTEM_WRITABLE], abi) if abi else False
    caps = _drop_capabilities()
    return Confinement(abi, caps, scoped, _seccomp())


# ---- the judge's own state, checked around every timed run ---------------------------------------------------


@dataclass
class JudgeState:
    """What a process beside the judge could change to slow it down or make it fail: each thread's scheduling
    policy, nice value and CPUs, and the process's resource limits."""

    threads: dict[str, tuple[int, int, tuple[int, ...]]]
    limits: dict[str, tuple[int, int]]


def judge_state() -> JudgeState:
    import resource

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
    return JudgeState(threads, limits)


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
    return out


def _cpus(cpus: tuple[int, ...]) -> str:
    return f"{len(cpus)} CPUs" if len(cpus) > 4 else str(cpus)


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
