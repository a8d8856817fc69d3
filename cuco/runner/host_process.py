"""The candidate's process for one rank as its judge holds it: started by rank.py before the judge imports torch,
so that the two start side by side."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from cuco.runner.channel import Channel
from cuco.runner.job import JUDGE_PORT_ENV, JUDGE_TOKEN_ENV, Job
from cuco.runner.pages import Page


@dataclass
class HostProcess:
    """The candidate's process for this rank, as its judge holds it."""

    proc: subprocess.Popen
    chan: Channel
    scratch: Path
    gate: Page | None  # the node's start gate (GPU)
    done: Page | None  # this rank's done flag (GPU)

    @classmethod
    def start(cls, job: Job, rank: int) -> HostProcess:
        shared_tmp = Path(job.tmp_dir)  # every rank's TMPDIR (launch() made it): torch's symmetric memory meets there
        # In the temporary folder too: a uid of the candidate's own (cuco as root) reaches it, wherever the run is.
        scratch = shared_tmp / f"host{rank}"
        scratch.mkdir(parents=True, exist_ok=True)
        chan, child = Channel.pair()
        env = {k: v for k, v in os.environ.items() if k not in (JUDGE_PORT_ENV, JUDGE_TOKEN_ENV)}  # the judges' alone
        proc = subprocess.Popen([sys.executable, "-m", "cuco.runner.host_start", str(child.fileno()),
                                 str(os.getpid())], pass_fds=[child.fileno()], cwd=scratch, env=env)
        child.close()
        gate = done = None
        page_fds: list[int] = []
        if job.device == "cuda":
            gate_fd = os.open(job.gate_file, os.O_RDWR)
            gate, (done, done_fd) = Page(gate_fd), Page.anonymous("cuco-done")
            page_fds = [gate_fd, done_fd]
        chan.send("hello", fds=page_fds, rank=rank, world=job.world, candidate_kind=job.kind, device=job.device,
                  candidate=job.candidate, library=job.library, harness=job.harness,
                  gpu=(job.gpus[rank] if job.gpus else rank) if job.device == "cuda" else None,
                  store_port=job.host_port, scratch=str(scratch), tmp=str(shared_tmp), uid=job.candidate_uid)
        for fd in page_fds:
            os.close(fd)
        return cls(proc, chan, scratch, gate, done)
