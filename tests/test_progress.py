"""The launcher's watch on the judges' progress (cuco.runner.processes.progress): a rank past its step's limit is
hung; a step without a limit, or within it, is not; a rank that has marked nothing yet has the start-up's limit."""

from __future__ import annotations

import os
import time

from cuco.runner.processes.progress import STARTUP_LIMIT_S, Watch, last_step, line


def _mark(path, what, limit_s, age_s=0.0):
    with open(path, "a") as f:
        f.write(line(1.0, what, limit_s))
    at = time.time() - age_s
    os.utime(path, (at, at))


def test_a_step_is_read_with_its_limit(tmp_path):
    p = tmp_path / "rank0.progress"
    _mark(p, "init: process group", 90.0)
    _mark(p, "L2 s trial 0: run", None)
    step = last_step(p)
    assert step.what == "L2 s trial 0: run" and step.limit_s is None
    assert last_step(tmp_path / "absent") is None


def test_a_rank_past_its_steps_limit_is_hung_and_named(tmp_path):
    paths = [tmp_path / f"rank{r}.progress" for r in range(2)]
    _mark(paths[0], "L4 s: timed run 3", 10.0, age_s=2)
    _mark(paths[1], "L4 s: timed run 3", 10.0, age_s=2)
    watch = Watch(paths)
    watch.poll()
    assert watch.stalled() == ""
    _mark(paths[1], "L4 s: timed run 4", 10.0, age_s=11)
    watch.poll()
    assert watch.stalled() == "rank 1 marked no progress for 10 s in 'L4 s: timed run 4'"


def test_a_step_without_a_limit_is_left_to_the_evaluations_limit(tmp_path):
    p = tmp_path / "rank0.progress"
    _mark(p, "bounds: timing compute_alone", None, age_s=3600)
    watch = Watch([p])
    watch.poll()
    assert watch.stalled() == ""


def test_a_rank_that_never_marks_a_step_has_the_start_ups_limit(tmp_path):
    watch = Watch([tmp_path / "rank0.progress"])
    watch.poll()
    assert watch.stalled() == ""
    assert watch.stalled(now=watch.started + STARTUP_LIMIT_S + 1) == \
        f"rank 0 marked no progress for {STARTUP_LIMIT_S:.0f} s in 'starting'"
