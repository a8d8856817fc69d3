"""Each rank's progress file: every step its judge takes, one line each ("seconds<TAB>limit<TAB>step"), and how long
the step may take. The launcher reads the last line of each while the ranks run: a rank that marks no new step
within its step's limit is hung (a candidate waiting on a flag nobody sets, a collective one rank never enters),
and every rank is stopped then, seconds after the hang, not at the end of the evaluation's whole time.

The limits say what a step should take at worst on a loaded machine. A run's grows with the shape: the longest run
step seen so far on it (the run, its inputs and the judge's check of it), times RUN_MULTIPLE.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

STARTUP_LIMIT_S = 90.0  # a process's start: Python and torch imported, a CUDA context, NCCL's communicator
SETUP_LIMIT_S = 25.0  # a shape's setup or teardown in the candidate: its allocations, windows and handles
FIRST_RUN_LIMIT_S = 25.0  # a compiled program's first run of a shape: lazy initialisation, cuBLAS's heuristics, NCCL
# connecting its peers
JIT_FIRST_RUN_LIMIT_S = 90.0  # a Python program's: the same, and its kernels compiled on first use (Triton, torch)
RUN_FLOOR_S = 10.0  # every later run step takes at most this long...
RUN_MULTIPLE = 20.0  # ... or this many times the longest run step on the shape so far


def line(elapsed_s: float, what: str, limit_s: float | None) -> str:
    return f"{elapsed_s:.3f}\t{f'{limit_s:.1f}' if limit_s else '-'}\t{what}\n"


@dataclass
class Step:
    what: str
    limit_s: float | None  # None: only the evaluation's whole limit bounds it
    since: float  # time.time() when it was marked (the file's modification time)


def last_step(path: Path) -> Step | None:
    """The last step marked in a progress file, None before the first."""
    try:
        stat = path.stat()
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return None
    if not lines:
        return None
    fields = lines[-1].split("\t")
    limit = float(fields[1]) if len(fields) == 3 and fields[1] != "-" else None
    return Step(fields[-1], limit, stat.st_mtime)


class Watch:
    """The ranks' progress files, read again only when they change."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self.started = time.time()
        self.seen: list[tuple[int, int] | None] = [None] * len(paths)
        self.steps: list[Step | None] = [None] * len(paths)

    def poll(self) -> list[Step | None]:
        for r, path in enumerate(self.paths):
            try:
                st = os.stat(path)
            except OSError:
                continue
            if (st.st_mtime_ns, st.st_size) != self.seen[r]:
                self.seen[r] = (st.st_mtime_ns, st.st_size)
                self.steps[r] = last_step(path)
        return self.steps

    def stalled(self, now: float | None = None) -> str:
        """Why a rank is taken for hung: the first one past its step's limit; "" while none is."""
        now = time.time() if now is None else now
        for r, step in enumerate(self.steps):
            what, limit, since = (step.what, step.limit_s, step.since) if step else \
                ("starting", STARTUP_LIMIT_S, self.started)
            if limit is not None and now - since > limit:
                return f"rank {r} marked no progress for {limit:.0f} s in '{what}'"
        return ""
