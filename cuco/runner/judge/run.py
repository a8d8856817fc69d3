"""A rank's judge from start to report: every failure, whoever's it is, ends as data in the rank's report."""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

from cuco.paths import atomic_write_json
from cuco.runner.judge.base import CandidateFailed, Judge, StageFailed
from cuco.runner.judge.bounds import BoundsJudge
from cuco.runner.judge.candidate import CandidateJudge
from cuco.runner.processes.candidate_handle import CandidateHandle
from cuco.runner.processes.job import Job
from cuco.runner.results.rank_report import RankReport
from cuco.runner.sandbox import kill_descendants


def run_judge(job: Job, rank: int, host: CandidateHandle | None) -> int:
    """The exit status of rank.py: 0 when the report holds a verdict (passed or not), 3 when the judge failed."""
    judge: Judge | None = None
    try:
        judge = BoundsJudge(job, rank) if job.mode == "bounds" else CandidateJudge(job, rank, host)
        judge.init()
        stages = judge.stages()
        judge.write_report(stages, done=True)
        judge.close()
        return 0
    except StageFailed as exc:
        judge.stop()
        judge.write_report(judge.reported, done=True, error=str(exc), failure="verification")
        return 0
    except Exception as exc:  # the judge reports every failure as data; the candidate's come as CandidateFailed
        whose = exc.failure if isinstance(exc, CandidateFailed) else _raised_in_reference(exc, job) or "runner"
        error = str(exc) if isinstance(exc, CandidateFailed) else f"{type(exc).__name__}: {exc}"
        if whose == "workload" and not isinstance(exc, CandidateFailed):
            error = f"the workload's reference.py raised {error}"
        failure = dict(error=error, failure=whose, traceback=traceback.format_exc(limit=8))
        if judge is not None:
            judge.stop()
            judge.write_report(judge.reported, done=True, **failure)
        else:
            kill_descendants()
            atomic_write_json(Path(job.out_dir) / f"rank{rank}.json", RankReport(rank, done=True, **failure).to_json())
        sys.stderr.write(failure["traceback"])
        return 3


def _raised_in_reference(exc: BaseException, job: Job) -> str | None:
    """"workload" when the exception came out of the workload's reference.py (the user's half of the contract),
    so that its author is told, and neither the candidate nor cuco is blamed."""
    reference = str(Path(job.workload_root, "reference.py").resolve())
    frames = traceback.extract_tb(exc.__traceback__)
    return "workload" if any(str(Path(f.filename).resolve()) == reference for f in frames) else None

