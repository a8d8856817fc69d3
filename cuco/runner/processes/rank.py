"""One rank of an evaluation: main([JOB.json, RANK]) in a process the judges' zygote forked (zygote.py).

The process becomes that rank's judge (judge/). Before it reads its token or draws a seed, it forks the candidate's
process (candidate_handle.py), which so inherits the zygote's import of torch too, and the host's CUDA context and
communicator start while the judge loads the workload.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

from cuco.paths import atomic_write_json
from cuco.runner.processes.candidate_handle import CandidateHandle
from cuco.runner.processes.job import Job
from cuco.runner.results.rank_report import RankReport
from cuco.runner.sandbox import guard_judge, kill_descendants, remove_shm_files


def _cleanup_on_term() -> None:
    """SIGTERM from the launcher's watchdog: kill the candidate's whole tree, then go. A thread waits for the
    signal, so the cleanup runs even while the main thread is blocked inside a collective."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def wait() -> None:
        signal.sigwait({signal.SIGTERM})
        kill_descendants()
        os._exit(143)

    threading.Thread(target=wait, daemon=True, name="cuco-judge-term").start()


def _report_start_failure(job: Job, rank: int, exc: OSError) -> None:
    """The rank's result file, written as the judge would, for a candidate's process that could not be started."""
    kill_descendants()
    report = RankReport(rank, done=True, failure="runner", error=f"cuco could not start the candidate's process: {exc}")
    atomic_write_json(Path(job.out_dir) / f"rank{rank}.json", report.to_json())


def main(argv: list[str]) -> int:
    os.umask(0o077)  # the judge's files (progress, reports) are its own: closed to a candidate of another uid
    job, rank = Job.read(Path(argv[0])), int(argv[1])
    guard_judge()
    from cuco.runner.judge.run import run_judge  # imported by the zygote already

    try:
        host = CandidateHandle.start(job, rank) if job.mode == "evaluate" else None
    except OSError as exc:  # before any code of the candidate's: cuco's own failure, said as such
        _report_start_failure(job, rank, exc)
        return 3
    _cleanup_on_term()  # a thread of its own: started after the fork, so the host holds none of the judge's
    code = run_judge(job, rank, host)
    # The result is on disk and the candidate's processes are gone: skip the interpreter's and CUDA's teardown.
    remove_shm_files([os.getpid()])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
