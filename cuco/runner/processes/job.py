"""The job a launcher hands to each rank's judge: plain JSON, so the judge needs no cuco config code.

It holds nothing secret: the seeds are drawn by the judges themselves, after they start; the port of the judges'
own group reaches them in CUCO_JUDGE_PORT, and the token that authenticates its members through a pipe whose
descriptor CUCO_JUDGE_TOKEN_FD names, read once the candidate's process has been forked off (read_token)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

JUDGE_PORT_ENV = "CUCO_JUDGE_PORT"
JUDGE_TOKEN_FD_ENV = "CUCO_JUDGE_TOKEN_FD"  # per launch: the judges' group admits only a process that holds it


def read_token() -> str:
    """The judges' token, from the pipe the launcher wrote it into; the descriptor is closed and its name dropped.
    Never in the environment: a process forked from the judge keeps its parent's environment block, token and all."""
    fd = os.environ.pop(JUDGE_TOKEN_FD_ENV, None)
    if fd is None:
        return ""
    with os.fdopen(int(fd), "rb") as pipe:
        return pipe.read().decode()


@dataclass
class Stage:
    level: str  # "L2" small-shape correctness, "L3" full-shape correctness, "L4" timing
    shape: str


@dataclass
class Job:
    workload_root: str
    world: int
    candidate: str  # path to the .cu or .py file
    language: str  # the candidate's: "cuda" or "python"
    device: str  # "cuda" or "cpu"
    stages: list[Stage]
    out_dir: str
    host_port: int  # the candidate hosts' own process group, apart from the judges'
    mode: str = "evaluate"  # or "bounds": the workload's reference timings, no candidate
    library: str | None = None  # built candidate .so
    harness: str | None = None  # built harness .so (CUDA machines)
    gate_file: str | None = None  # /dev/shm page shared by the ranks of this node
    tmp_dir: str | None = None  # every rank's TMPDIR, made short by the launcher (a Unix socket's path: 107 bytes)
    candidate_uid: int | None = None  # the unprivileged uid the candidate runs under when cuco runs as root
    gpus: list[int] = field(default_factory=list)
    warmup: int | None = None  # overrides of the workload's timing settings
    iters: int | None = None
    env: dict[str, str] = field(default_factory=dict)  # the workload's [nccl_env]

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def read(cls, path: Path) -> Job:
        data = json.loads(Path(path).read_text())
        data["stages"] = [Stage(**s) for s in data["stages"]]
        return cls(**data)
