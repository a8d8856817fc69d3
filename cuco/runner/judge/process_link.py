"""The candidate judge's side of its channel to the candidate's process: every reply the judge waits for, and
every way the process can fail to give it, turned into the candidate's failure (or cuco's, before the candidate
is loaded)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from cuco.runner.judge.base import CandidateFailed
from cuco.runner.processes.candidate_handle import CandidateHandle
from cuco.runner.processes.channel import ChannelClosed, RemoteError, Reply
from cuco.runner.processes.launch import describe_exit
from cuco.runner.sandbox import judge_state, kill_descendants, remove_shm_files, state_changes

HOST_START_S = 120.0  # the host's imports, process group and NCCL communicator


class ProcessLink:
    def __init__(self, host: CandidateHandle, out: Path, rank: int) -> None:
        self.host, self.out, self.rank = host, out, rank
        self.proc: subprocess.Popen | None = host.proc  # None once the host is stopped
        self.state = judge_state()

    @property
    def gate(self):
        return self.host.gate

    def ready(self) -> str:
        """Waits for the host's start-up; how it is confined."""
        sandbox = str(self.call("ready", timeout_s=HOST_START_S, where="start-up").data.get("sandbox", ""))[:300]
        self.state = judge_state()  # every thread of this judge exists by now
        return sandbox

    def check_reach(self, where: str) -> None:
        """Fails the candidate if this judge's scheduling, affinity or limits changed: only a process beside it
        could have changed them, to slow its clock's reader or make it fail."""
        now = judge_state()
        changes = state_changes(self.state, now)
        if changes:
            raise CandidateFailed(f"{where}: this rank's judge was reached from outside: {changes[0]} (a candidate "
                                  f"may not change its judge's scheduling or limits)", "candidate")
        for tid, value in now.threads.items():  # threads started since: checked from now on
            self.state.threads.setdefault(tid, value)

    def gone(self, where: str) -> CandidateFailed:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return CandidateFailed(f"the candidate's process stopped answering during {where}", "crash")
        if where == "start-up":  # nothing of the candidate's has been loaded yet: the runner's own failure
            return CandidateFailed(f"cuco's process for the candidate ended ({describe_exit(code)}) during start-up, "
                                   f"before loading it; its output is in {self.out / f'rank{self.rank}.log'}",
                                   "runner")
        if code < 0:
            return CandidateFailed(f"the candidate's process was {describe_exit(code)} during {where}", "crash")
        return CandidateFailed(f"the candidate's process exited with status {code} during {where}: a candidate may "
                               f"not end its process, and passes only by finishing every run", "candidate")

    def call(self, expect: str, where: str, timeout_s: float | None = None) -> Reply:
        """The host's next reply, which must be `expect`; any other outcome is the candidate's failure."""
        try:
            return self.host.chan.expect(expect, timeout_s)
        except ChannelClosed:
            raise self.gone(where) from None
        except RemoteError as exc:
            # The runner's code in the candidate's process fails on its own only before the candidate is loaded;
            # after that, the candidate shares the process and may have caused it.
            runner = exc.where == "framework" and where == "start-up"
            raise CandidateFailed(str(exc), "runner" if runner else "candidate") from None
        except (ValueError, TimeoutError) as exc:
            raise CandidateFailed(f"{where}: {exc}", "candidate") from None

    def send(self, kind: str, fds: list[int] | None = None, **fields: Any) -> None:
        try:
            self.host.chan.send(kind, fds=fds, where=fields.pop("where", kind), **fields)
        except ChannelClosed:
            raise self.gone(kind) from None

    def wait_done(self, seq: int, where: str) -> None:
        """Spins on the done flag the candidate's stream raises after run `seq` and its snapshot."""
        spins = 0
        while self.host.done.read() < seq:
            spins += 1
            if spins % 20000 == 0 and self.proc.poll() is not None:
                raise self.gone(where)

    def stop(self) -> None:
        """The host has nothing to keep once its last reply is in: it is killed with everything it started,
        detached or not, rather than waited for through its own exit."""
        if self.proc is None:
            return
        kill_descendants()
        remove_shm_files([self.proc.pid])
        self.proc = None
        shutil.rmtree(self.host.scratch, ignore_errors=True)
