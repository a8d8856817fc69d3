"""Start the judges of one evaluation locally, each in its own process group, under a watchdog.

Each rank's judge is forked by this process's judges' zygote (zygote.py) and starts the candidate's process for that
rank (rank.py, judge/, host.py). A candidate that hangs (most often a device barrier nobody satisfies) or that crashes
one rank leaves the other ranks waiting forever; the watchdog stops every judge when the time limit passes, or shortly
after the first judge reports a failure, and says where each rank was. Stopping is SIGTERM first: each judge then kills
its candidate's whole process tree (detached processes included, see sandbox/); SIGKILL of the process groups follows
for a judge that does not go. Where the candidate ran under a uid of its own (cuco as root), every process of that uid
is killed once the judges are gone, before any report is read.
"""

from __future__ import annotations

import json
import mmap
import os
import secrets
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cuco.machine import SAFE_ENV
from cuco.runner.processes.job import JUDGE_PORT_ENV, Job
from cuco.runner.processes.progress import Watch, last_step
from cuco.runner.processes.zygote_client import Judge, ZygoteGone, zygote
from cuco.runner.results.rank_report import RankReport
from cuco.runner.sandbox import candidate_uid, claim_uid, keep_private, sweep_uid

CRASH_GRACE_S = 5.0  # after one rank dies, the others get this long to report their own state
TERM_GRACE_S = 3.0  # a judge told to stop has this long to kill its candidate's processes
POLL_S = 0.05


@dataclass
class RankOutcome:
    rank: int
    returncode: int | None  # None: killed by the watchdog
    report: RankReport  # as the judge left it (empty where it wrote none)
    last_step: str
    log_tail: str


@dataclass
class LaunchResult:
    ranks: list[RankOutcome]
    timed_out: bool
    crashed: list[int] = field(default_factory=list)
    seconds: float = 0.0
    stalled: str = ""  # why the watchdog took a rank for hung before the evaluation's whole limit ran out

    def killed(self) -> bool:
        return self.timed_out or bool(self.crashed)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_gate_file(out_dir: Path) -> str:
    """A zeroed page in /dev/shm (falls back to the run directory) that every rank maps."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else out_dir
    path = base / f"cuco-gate-{os.getpid()}-{time.time_ns()}"
    path.write_bytes(b"\0" * mmap.PAGESIZE)
    return str(path)


def _tail(path: Path, n: int = 3000) -> str:
    if not path.is_file():
        return ""
    data = path.read_bytes()
    return data[-n:].decode(errors="replace")


def _last_line(path: Path) -> str:
    """The last step a rank's judge marked."""
    step = last_step(path)
    return step.what if step else "not started"


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def stop(procs: list[Judge]) -> None:
    """SIGTERM every judge still running (each kills its candidate's tree), then SIGKILL what is left."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    end = time.monotonic() + TERM_GRACE_S
    while time.monotonic() < end and any(p.poll() is None for p in procs):
        time.sleep(POLL_S)
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


# A port picked free can be taken before a rank binds it (an outgoing connection's ephemeral port, or another
# evaluation starting beside this one); a launch whose ranks lost theirs while starting up is run again, on new ports.
PORT_TRIES = 3


def launch(job: Job, timeout_s: float, job_path: Path, on_step: Callable[[str], None] | None = None) -> LaunchResult:
    """Run every rank of JOB under the watchdog; TIMEOUT_S bounds each attempt; ON_STEP hears rank 0's steps."""
    out = Path(job.out_dir).absolute()  # the judges and hosts start in folders of their own
    job.out_dir = str(out)
    out.mkdir(parents=True, exist_ok=True)
    visible = list(job.gpus)  # the machine's GPU indices; the ranks see them as 0..n-1
    # The ranks' shared TMPDIR, where a program's processes meet by Unix sockets (torch's symmetric memory): not
    # under the evaluation's folder, whose depth a search's run directory sets, since a socket's path that passes
    # 107 bytes cannot be bound.
    tmp = Path(tempfile.mkdtemp(prefix="cuco-"))
    job.tmp_dir = str(tmp)
    keep_private()  # this process holds the judges' token: closed to a candidate of the same uid
    uid = candidate_uid() if job.mode == "evaluate" else None
    job.candidate_uid = None if uid is None else claim_uid(uid)
    try:
        for attempt in range(PORT_TRIES):
            if attempt:
                job.host_port = free_port()
                for f in (*out.glob("rank*.json"), *out.glob("rank*.progress")):
                    f.unlink()
            res = _watch(_start(job, job_path, out, visible), out, timeout_s, job.candidate_uid, on_step)
            if not _lost_a_port(res):
                break
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return res


def _lost_a_port(res: LaunchResult) -> bool:
    """A rank failed to bind its process group's port before the candidate was loaded: nothing of it ran yet."""
    return any(o.last_step.startswith("init") and "address already in use" in
               ((o.report.error or "") + o.log_tail).lower() for o in res.ranks)


def _start(job: Job, job_path: Path, out: Path, visible: list[int]) -> list[Judge]:
    env = {**os.environ, **SAFE_ENV, "PYTHONUNBUFFERED": "1"}
    env.setdefault("OMP_NUM_THREADS", "1")
    # The judges must import this cuco, even when it is not installed (a GPU machine's plain python3).
    root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    forker = zygote(env)
    env = {**env, **job.env, **SAFE_ENV, "CUCO_WORLD_SIZE": str(job.world), JUDGE_PORT_ENV: str(free_port())}
    token = secrets.token_hex(32).encode()
    if job.device == "cuda" and visible:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in visible)
        job.gpus = list(range(len(visible)))
    job.write(job_path)
    judges = []
    try:
        for r in range(job.world):
            log = os.open(out / f"rank{r}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
            read, write = os.pipe()  # the token: 64 bytes, within any pipe's buffer
            os.write(write, token)
            os.close(write)
            try:
                judges.append(forker.fork([str(job_path), str(r)], {**env, "RANK": str(r)}, os.getcwd(), log, read))
            finally:
                os.close(read)
                os.close(log)
    except ZygoteGone:
        stop(judges)
        raise
    return judges


def _watch(procs: list[Judge], out: Path, timeout_s: float, uid: int | None = None,
           on_step: Callable[[str], None] | None = None) -> LaunchResult:
    """Until every rank has exited: a rank that died gives the others CRASH_GRACE_S to report, a rank that marks no
    progress within its step's limit (progress.py), or the whole of TIMEOUT_S, stops them all. ON_STEP hears rank
    0's steps as they come."""
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    first_death: float | None = None
    timed_out, stalled, told = False, "", ""
    deaths: list[int] = []  # ranks that exited with an error, in the order the watchdog saw them go
    progress = Watch([out / f"rank{r}.progress" for r in range(len(procs))])
    while True:
        codes = [p.poll() for p in procs]
        deaths += [r for r, c in enumerate(codes) if c not in (None, 0) and r not in deaths]
        if all(c is not None for c in codes):
            break
        now = time.monotonic()
        if deaths and first_death is None:
            first_death = now
        steps = progress.poll()
        if on_step and steps[0] and steps[0].what != told:
            told = steps[0].what
            on_step(told)
        stalled = "" if deaths else progress.stalled()
        if now > deadline or stalled or (first_death is not None and now - first_death > CRASH_GRACE_S):
            timed_out = now > deadline or bool(stalled)
            stop(procs)
            break
        time.sleep(POLL_S)
    if uid is not None:  # whatever of the candidate's uid is left, wherever it is, before any report is read
        sweep_uid(uid)
    outcomes = []
    for r, p in enumerate(procs):
        res_path = out / f"rank{r}.json"
        report = RankReport.from_json(json.loads(res_path.read_text())) if res_path.is_file() else RankReport(r)
        code = p.returncode
        # 143 = 128 + SIGTERM: how a judge that took the watchdog's SIGTERM exits (rank.py)
        stopped = code in (-signal.SIGKILL, 143) and (timed_out or first_death is not None)
        killed = stopped and not report.done
        outcomes.append(RankOutcome(r, None if killed else code, report, _last_line(out / f"rank{r}.progress"),
                                    _tail(out / f"rank{r}.log")))
    # Ranks that failed on their own, in the order they went: the first is usually the cause.
    order = deaths + [r for r in range(len(procs)) if r not in deaths]
    crashed = [r for r in order if outcomes[r].returncode not in (0, None)]
    return LaunchResult(outcomes, timed_out, crashed, time.monotonic() - t0, stalled)

