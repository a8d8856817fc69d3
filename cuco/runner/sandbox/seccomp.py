"""The candidate's seccomp filter (Linux 3.17+, unprivileged once no_new_privs is set), on every thread.

Refused outright: every way into another process (ptrace, process_vm_*, pidfd_getfd, process_madvise, kcmp) and
the kernel interfaces a GPU program never needs but an escape does: new namespaces (unshare, setns, and clone with
a CLONE_NEW* flag: a user namespace hands back capabilities inside it), io_uring (its operations bypass this
filter), userfaultfd (stalls the kernel mid-copy, the classic race widener), perf_event_open, bpf, the keyrings,
mounts, kexec and modules. clone3 answers ENOSYS, so that the C library falls back to clone, whose flags a filter
can read (clone3 passes them in memory). Scheduling policy, priority and resource limits pass only for the process
itself (a pid of 0 or its own), so a candidate cannot slow its judge down or lower its limits. Affinity calls name
threads by their own ids (NCCL and OpenMP pin their threads so), so they pass: the judge checks its own affinity
around every timed run instead (processes.judge_state).
"""

from __future__ import annotations

import ctypes
import errno
import os

from cuco.runner.sandbox.native import SandboxError, libc, prctl

# <linux/seccomp.h>, <linux/filter.h>, <linux/audit.h>
SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC = 1, 1
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_JSET_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
SECCOMP_NR, SECCOMP_ARCH, SECCOMP_ARGS = 0, 4, 16  # offsets in struct seccomp_data; each arg is 8 bytes
X32_SYSCALL_BIT = 0x40000000
PR_SET_NO_NEW_PRIVS, PR_GET_SECCOMP = 38, 21  # <linux/prctl.h>

# <linux/sched.h>: the namespace flags of clone and unshare (CLONE_NEWTIME shares its bit with clone's exit signal,
# so it is read for unshare alone).
CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWTIME = 0x10000000, 0x20000000, 0x40000000, 0x80
NEW_NAMESPACES = (CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID
                  | CLONE_NEWNET)

# Syscall numbers, (x86_64, aarch64), from <asm/unistd_64.h> and <asm-generic/unistd.h>.
NUMBERS = {
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "pidfd_getfd": (438, 438), "process_madvise": (440, 440), "kcmp": (312, 272), "ioprio_set": (251, 30),
    "setns": (308, 268), "io_uring_setup": (425, 425), "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427), "userfaultfd": (323, 282), "perf_event_open": (298, 241), "bpf": (321, 280),
    "add_key": (248, 217), "request_key": (249, 218), "keyctl": (250, 219), "mount": (165, 40),
    "umount2": (166, 39), "pivot_root": (155, 41), "open_tree": (428, 428), "move_mount": (429, 429),
    "fsopen": (430, 430), "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433),
    "mount_setattr": (442, 442), "kexec_load": (246, 104), "kexec_file_load": (320, 294),
    "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106),
    "clone": (56, 220), "clone3": (435, 435), "unshare": (272, 97),
    "sched_setparam": (142, 118), "sched_setscheduler": (144, 119), "sched_setattr": (314, 274),
    "prlimit64": (302, 261), "setpriority": (141, 140), "seccomp": (317, 277),
}
REFUSED = ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "process_madvise", "kcmp", "ioprio_set",
           "setns", "io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd", "perf_event_open", "bpf",
           "add_key", "request_key", "keyctl", "mount", "umount2", "pivot_root", "open_tree", "move_mount", "fsopen",
           "fsconfig", "fsmount", "fspick", "mount_setattr", "kexec_load", "kexec_file_load", "init_module",
           "finit_module", "delete_module")
OWN_PID_ARG0 = ("sched_setparam", "sched_setscheduler", "sched_setattr", "prlimit64")
ARCHES = {"x86_64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1)}  # AUDIT_ARCH_*, column of NUMBERS


def _nr(name: str, machine: str) -> int:
    return NUMBERS[name][ARCHES[machine][1]]


def program(machine: str, pid: int) -> list[tuple[int, int, int, int]]:
    """The BPF program: (code, jump if true, jump if false, k), jumps relative to the next instruction."""
    deny, allow = ("ret", SECCOMP_RET_ERRNO | errno.EPERM), ("ret", SECCOMP_RET_ALLOW)
    audit = ARCHES[machine][0]
    prog: list[tuple] = [("ld", SECCOMP_ARCH), ("jne", audit, "deny"), ("ld", SECCOMP_NR)]
    if machine == "x86_64":
        prog.append(("jge", X32_SYSCALL_BIT, "deny"))  # x32 numbers would bypass the table below
    prog += [("jeq", _nr(name, machine), "deny") for name in REFUSED]
    prog += [("jeq", _nr("clone3", machine), "enosys"), ("jeq", _nr("clone", machine), "clone"),
             ("jeq", _nr("unshare", machine), "unshare")]
    prog += [("jeq", _nr(name, machine), "own0") for name in OWN_PID_ARG0]
    prog += [("jeq", _nr("setpriority", machine), "prio"), allow]
    labels: dict[str, int] = {}

    def block(label: str, *ins: tuple) -> None:
        labels[label] = len(prog)
        prog.extend(ins)

    block("own0", ("ld", SECCOMP_ARGS), ("jeq", 0, "allow"), ("jeq", pid, "allow"), deny)
    # setpriority(which, who): only PRIO_PROCESS (0), only itself
    block("prio", ("ld", SECCOMP_ARGS), ("jne", 0, "deny"), ("ld", SECCOMP_ARGS + 8), ("jeq", 0, "allow"),
          ("jeq", pid, "allow"), deny)
    block("clone", ("ld", SECCOMP_ARGS), ("jset", NEW_NAMESPACES, "deny"), allow)  # flags: the low word of arg 0
    block("unshare", ("ld", SECCOMP_ARGS), ("jset", NEW_NAMESPACES | CLONE_NEWTIME, "deny"), allow)
    block("deny", deny)
    block("allow", allow)
    block("enosys", ("ret", SECCOMP_RET_ERRNO | errno.ENOSYS))
    codes = {"jeq": BPF_JEQ_K, "jne": BPF_JEQ_K, "jge": BPF_JGE_K, "jset": BPF_JSET_K}
    out = []
    for i, ins in enumerate(prog):
        if ins[0] == "ld":
            out.append((BPF_LD_W_ABS, 0, 0, ins[1]))
        elif ins[0] == "ret":
            out.append((BPF_RET_K, 0, 0, ins[1]))
        else:
            jump = labels[ins[2]] - i - 1
            assert 0 <= jump < 256, "a BPF jump is one byte"
            out.append((codes[ins[0]], 0, jump, ins[1]) if ins[0] == "jne" else (codes[ins[0]], jump, 0, ins[1]))
    return out


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def seccomp_available() -> bool:
    """Whether this machine can install the host's filter (a table for its architecture, filters in its kernel)."""
    return os.uname().machine in ARCHES and prctl(PR_GET_SECCOMP) >= 0


def install() -> bool:
    """Install the filter on every thread of this process; False where the architecture or kernel has none."""
    machine = os.uname().machine
    if machine not in ARCHES:
        return False
    prog = program(machine, os.getpid())
    insns = (_SockFilter * len(prog))(*[_SockFilter(*ins) for ins in prog])
    fprog = _SockFprog(len(prog), insns)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    if libc.syscall(_nr("seccomp", machine), SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC,
                    ctypes.byref(fprog)) != 0:
        err = ctypes.get_errno()
        if err in (errno.ENOSYS, errno.EINVAL):  # a kernel built without seccomp filters
            return False
        raise SandboxError(f"seccomp: {os.strerror(err)}")
    return True
