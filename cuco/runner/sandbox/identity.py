"""Who the candidate runs as: never root.

When cuco runs as root (as GPU machines run it), every evaluation's candidate processes run under an unprivileged uid
and gid of their own, far above any a system hands out. Root without capabilities can still write what root owns
(/proc/sys/kernel/core_pattern, whose pipe helper the kernel starts as root outside every sandbox; /dev's raw
disks; the judge's /proc entries); an unprivileged uid cannot, and everything of that uid is the evaluation's, so
the launcher can kill all of it at the end (processes.sweep_uid). When cuco runs as an ordinary user, that user is
already unprivileged, and the candidate keeps it.

An unprivileged uid cannot read beneath a folder closed to others (a Python in /root/.pyenv, a checkout in a home
folder). Before it drops root, the host makes what it must read reachable in a mount namespace of its own: a folder
closed to others on the way is covered by an empty tmpfs that holds only the entries on the way, bound back from
the original, so the rest of that folder (keys, other projects) stays out of sight. The host's own files (the
candidate's source or library) are copied into its scratch folder instead.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import signal
import stat
from pathlib import Path

from cuco.runner.sandbox.native import SandboxError, libc, prctl

UID_BASE = 1 << 30  # above system (< 1000), user (< 60000) and subordinate (100000 + 65536 n) uids
CAP_SETGID, CAP_SETUID, CAP_SYS_ADMIN = 6, 7, 21  # <linux/capability.h>
CLONE_NEWNS = 0x20000
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 4096, 16384, 1 << 18  # <linux/mount.h>
PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
_launches = itertools.count()


def _effective_caps() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def _can_give_up_root() -> bool:
    caps = _effective_caps()
    return os.geteuid() == 0 and bool((caps >> CAP_SETUID) & 1) and bool((caps >> CAP_SETGID) & 1)


def _mapped(uid: int, table: str) -> bool:
    """Whether uid exists in this user namespace (a container may map only a range)."""
    try:
        rows = [list(map(int, line.split())) for line in Path(f"/proc/self/{table}").read_text().splitlines()]
    except OSError:
        return True
    return any(inside <= uid < inside + count for inside, _, count in rows)


def candidate_uid() -> int | None:
    """The uid the candidate of the evaluation about to start runs under, or None to keep cuco's own (an ordinary
    user's, or root's where cuco holds no CAP_SETUID to give it up: then Landlock alone keeps root's files closed).
    Unique among the evaluations of this machine that run at once: the launcher's pid and a count of its launches."""
    if not _can_give_up_root():
        return None
    uid = UID_BASE + ((os.getpid() % (1 << 22)) << 8) + next(_launches) % 256
    if not (_mapped(uid, "uid_map") and _mapped(uid, "gid_map")):
        raise SandboxError(f"cannot run the candidate under an unprivileged uid: uid {uid} is not mapped in this "
                           f"user namespace (/proc/self/uid_map)")
    return uid


def candidate_runs_as() -> str:
    """Who a candidate evaluated by this process would run as, in words (cuco doctor)."""
    if os.geteuid() != 0:
        return f"uid {os.geteuid()}, yours: an ordinary user is unprivileged already"
    if _can_give_up_root():
        return "a uid of each evaluation's own (cuco runs as root and gives root up for the candidate)"
    return "uid 0: cuco runs as root without CAP_SETUID, so Landlock alone keeps root's files closed"


def become(uid: int, parent: int) -> None:
    """This process (every thread) as uid and gid `uid` with no supplementary groups. The kernel clears the
    parent-death signal and the dumpable flag on the change: both are set again (dumpable, so that the process's
    own /proc entries are its own, as any unprivileged process's are)."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    prctl(PR_SET_DUMPABLE, 1)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the signal was armed again
        os._exit(1)


def _allows(st: os.stat_result, uid: int, owner_bit: int, other_bit: int) -> bool:
    """Whether the mode grants uid (whose gid is its own) a right: as the owner, or as anyone else."""
    return bool(st.st_mode & (owner_bit if st.st_uid == uid else other_bit))


def _closed(path: Path, uid: int) -> bool:
    """Whether uid may not pass through a folder."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and not _allows(st, uid, stat.S_IXUSR, stat.S_IXOTH)


def _unreadable(path: Path, uid: int) -> bool:
    st = os.stat(path)
    return stat.S_ISDIR(st.st_mode) and not _allows(st, uid, stat.S_IRUSR, stat.S_IROTH)


def _closed_on_the_way(paths: list[Path], uid: int) -> dict[Path, set[str]]:
    """Every folder closed to others on the way to PATHS, with the names beneath it on the way (an empty set: the
    folder is itself needed, and all of it stays)."""
    out: dict[Path, set[str]] = {}
    whole: set[Path] = set()  # needed themselves: on the way to another path too, they still stay whole
    for path in paths:
        parts = path.parts
        for i in range(1, len(parts)):
            folder = Path(*parts[:i])
            if _closed(folder, uid):
                out.setdefault(folder, set()).add(parts[i])
        if _closed(path, uid) or _unreadable(path, uid):
            whole.add(path)
    return {**out, **{folder: set() for folder in whole}}


def _mount(source: str | None, target: Path, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return s.encode() if s is not None else None

    if libc.mount(enc(source), str(target).encode(), enc(fstype), flags, enc(data)) != 0:
        raise SandboxError(f"mount {source or fstype} on {target}: {os.strerror(ctypes.get_errno())}")


def _cover(folder: Path, keep: set[str]) -> None:
    """An empty tmpfs over FOLDER, open to others, holding only KEEP (all entries where empty) bound back."""
    fd = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)  # the original, still reachable beneath
    try:
        names = sorted(keep) if keep else sorted(os.listdir(folder))
        _mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
        for name in names:
            source, target = f"/proc/self/fd/{fd}/{name}", folder / name
            try:
                st = os.lstat(source)
            except FileNotFoundError:
                continue
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(source), target)
            elif stat.S_ISDIR(st.st_mode):
                target.mkdir()
                _mount(source, target, None, MS_BIND | MS_REC)
            elif stat.S_ISREG(st.st_mode):
                target.touch()
                _mount(source, target, None, MS_BIND)
    finally:
        os.close(fd)


def reach(paths: list[Path], uid: int) -> list[str]:
    """Make PATHS readable to UID in a mount namespace of this process's own (nothing outside it changes); returns
    the folders covered. Needs CAP_SYS_ADMIN, so call it as root, before dropping it."""
    closed = _closed_on_the_way([Path(os.path.realpath(p)) for p in paths if os.path.exists(p)], uid)
    if not closed:
        return []
    if libc.unshare(CLONE_NEWNS) != 0:
        raise SandboxError(f"unshare(CLONE_NEWNS): {os.strerror(ctypes.get_errno())}")
    _mount(None, Path("/"), None, MS_REC | MS_PRIVATE)  # nothing mounted here propagates out
    for folder in sorted(closed, key=lambda p: len(p.parts)):  # outer folders first: inner ones are bound by then
        _cover(folder, closed[folder])
    return [str(f) for f in sorted(closed)]
