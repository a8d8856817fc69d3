"""Tries every way out of the sandbox that would let it forge a score: a core_pattern pipe helper (the kernel starts
it as root, outside every sandbox), the judge's /proc entries (its OOM score, its autogroup), a raw disk, a user
namespace (capabilities inside it), io_uring (operations the seccomp filter never sees), userfaultfd, perf events,
bpf and the keyrings. Each door that opens is named in its error; with every door shut it computes nothing, and its
outputs stay poisoned. Nothing is written through a door it finds open: opening one is the proof."""

import ctypes
import errno
import glob
import os
import platform

LIBC = ctypes.CDLL(None, use_errno=True)
# (x86_64, aarch64) numbers of the syscalls tried below
NR = {"io_uring_setup": (425, 425), "userfaultfd": (323, 282), "perf_event_open": (298, 241), "bpf": (321, 280),
      "keyctl": (250, 219)}
CLONE_NEWUSER = 0x10000000


def _nr(name):
    return NR[name][0 if platform.machine() == "x86_64" else 1]


def _opens_for_writing(path):
    try:
        os.close(os.open(path, os.O_WRONLY))
        return True
    except OSError:
        return False


def _reaches_the_kernel(name, *args):
    """A call that succeeds, or fails for any reason but a refusal (EPERM, EACCES) or absence (ENOSYS), got in."""
    r = LIBC.syscall(_nr(name), *args)
    if r >= 0:
        if name != "keyctl":
            os.close(r)
        return True
    return ctypes.get_errno() not in (errno.EPERM, errno.EACCES, errno.ENOSYS)


def doors():
    judge = os.getppid()
    found = [p for p in ("/proc/sys/kernel/core_pattern", f"/proc/{judge}/oom_score_adj", f"/proc/{judge}/autogroup",
                         "/proc/sysrq-trigger") if _opens_for_writing(p)]
    found += [p for p in sorted(glob.glob("/dev/sd?") + glob.glob("/dev/nvme?n?") + glob.glob("/dev/vd?"))
              if _opens_for_writing(p)]
    if LIBC.unshare(CLONE_NEWUSER) == 0:
        found.append("a user namespace")
    attr = ctypes.create_string_buffer(128)  # struct perf_event_attr: a software clock of this process
    ctypes.memmove(attr, (ctypes.c_uint32 * 2)(1, 128), 8)
    tries = {"io_uring": ("io_uring_setup", 1, ctypes.create_string_buffer(120)),  # struct io_uring_params
             "userfaultfd": ("userfaultfd", 0), "perf_event_open": ("perf_event_open", attr, 0, -1, -1, 0),
             "bpf": ("bpf", 0, ctypes.create_string_buffer(64), 64),  # BPF_MAP_CREATE of nothing
             "the keyrings": ("keyctl", 0, -3, 0)}  # KEYCTL_GET_KEYRING_ID of the session keyring
    return found + [door for door, call in tries.items() if _reaches_the_kernel(*call)]


def setup(ctx):
    found = doors()
    if found:
        raise RuntimeError("ESCAPED through " + ", ".join(found))


def run(ctx):
    pass  # with every door shut there is nothing to forge the outputs from
