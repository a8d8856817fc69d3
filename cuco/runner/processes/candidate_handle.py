"""The candidate's process for one rank as its judge holds it: forked from the judge (which holds torch, imported
once by the judges' zygote) before the judge holds anything secret (rank.py).

The child keeps nothing of the judge but the modules it imported: it arms its parent-death signal before anything
else, closes every descriptor but its channel and the log, leaves the judge's non-dumpable setting and folder, and
becomes the candidate's process (cuco.runner.processes.candidate_process), which confines itself before any code of
the candidate's runs."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from cuco.runner.processes.channel import Channel
from cuco.runner.processes.job import JUDGE_PORT_ENV, Job
from cuco.runner.processes.pages import Page
from cuco.runner.sandbox.native import prctl
from cuco.runner.sandbox.processes import end_as_child, name_process

PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4  # <linux/prctl.h>


class Forked:
    """A forked child as subprocess.Popen shows one (pid, poll, wait, returncode): what the judge's link uses."""

    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, None
        self._exited = os.pidfd_open(pid)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped already, by kill_descendants after it killed it
                pid, status = self.pid, -signal.SIGKILL
            if pid:
                self.returncode = status if status < 0 else os.waitstatus_to_exitcode(status)
                os.close(self._exited)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.poll() is None and not select.select([self._exited], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired(f"candidate process {self.pid}", timeout)
        while self.poll() is None:  # readable: it has exited, and is reaped now
            pass
        return self.returncode


def _become_candidate_process(fd: int, scratch: Path, judge: int) -> NoReturn:
    """The child's side of the fork: never returns into the judge's code."""

    def host() -> int:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != judge:  # the judge died before the signal was armed
            os._exit(1)
        name_process("cuco-host")
        prctl(PR_SET_DUMPABLE, 1)  # the judge's guard_judge setting: a process of its own uid keeps its /proc
        os.closerange(3, fd)
        os.closerange(fd + 1, os.sysconf("SC_OPEN_MAX"))
        os.environ.pop(JUDGE_PORT_ENV, None)
        os.chdir(scratch)
        if sys.path and not sys.flags.safe_path:  # the folder the zygote started in: now the host's
            sys.path[0] = str(scratch)
        from cuco.runner.processes.candidate_process import main

        return main([str(fd)])

    end_as_child(host)


@dataclass
class CandidateHandle:
    """The candidate's process for this rank, as its judge holds it."""

    proc: Forked
    chan: Channel
    scratch: Path
    gate: Page | None  # the node's start gate (GPU)
    done: Page | None  # this rank's done flag (GPU)

    @classmethod
    def start(cls, job: Job, rank: int) -> CandidateHandle:
        shared_tmp = Path(job.tmp_dir)  # every rank's TMPDIR (launch() made it): torch's symmetric memory meets there
        # In the temporary folder too: a uid of the candidate's own (cuco as root) reaches it, wherever the run is.
        scratch = shared_tmp / f"host{rank}"
        scratch.mkdir(parents=True, exist_ok=True)
        chan, child = Channel.pair()
        judge = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _become_candidate_process(child.fileno(), scratch, judge)
        child.close()
        proc = Forked(pid)
        gate = done = None
        page_fds: list[int] = []
        if job.device == "cuda":
            gate_fd = os.open(job.gate_file, os.O_RDWR)
            gate, (done, done_fd) = Page(gate_fd), Page.anonymous("cuco-done")
            page_fds = [gate_fd, done_fd]
        chan.send("hello", fds=page_fds, rank=rank, world=job.world, candidate_language=job.language, device=job.device,
                  candidate=job.candidate, library=job.library, harness=job.harness,
                  gpu=(job.gpus[rank] if job.gpus else rank) if job.device == "cuda" else None,
                  store_port=job.host_port, scratch=str(scratch), tmp=str(shared_tmp), uid=job.candidate_uid)
        for fd in page_fds:
            os.close(fd)
        return cls(proc, chan, scratch, gate, done)
