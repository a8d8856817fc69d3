"""Side-by-side comparisons (cuco.runner.results.comparison): a speedup with its interval, "within noise" where the
interval holds 1.0; the rounds' order; and `cuco compare` on the CPU example, where a copy of the seed is never
faster."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

from cuco.runner.results.comparison import MAX_ROUNDS, T_QUANTILE, compare, order, pending


def test_the_rounds_alternate_their_order():
    assert [order(["a", "b"], i) for i in range(4)] == [["a", "b"], ["b", "a"], ["a", "b"], ["b", "a"]]


def test_a_resumed_comparison_makes_only_the_launches_it_lacks():
    assert list(pending(["a", "b"], 3, {"a": [], "b": []})) == [(0, "a"), (0, "b"), (1, "b"), (1, "a"), (2, "a"),
                                                                 (2, "b")]
    assert list(pending(["a", "b"], 3, {"a": [1.0, 1.0], "b": [1.0]})) == [(1, "b"), (2, "a"), (2, "b")]


def test_a_clear_difference_is_faster_or_slower_with_the_ratio_inside_its_interval():
    fast, slow = [1.00, 1.02, 0.99, 1.01, 1.00], [2.01, 2.05, 1.98, 2.00, 2.03]
    c = compare("new", fast, "old", slow)
    assert c.verdict == "faster" and c.low < c.speedup < c.high and c.low > 1.9 and math.isclose(c.speedup, 2.0,
                                                                                                  rel_tol=0.02)
    assert compare("old", slow, "new", fast).verdict == "slower"
    assert "faster" in c.words() and "99.9% interval" in c.words() and "5 alternating rounds" in c.words()


def test_a_machine_that_slows_down_through_the_rounds_weighs_on_both_alike():
    """The same program twice on a machine that gets 30% slower each round: every single-evaluation ratio says one
    is faster (the second of each round is slower), the alternating order cancels it."""
    times = [1.3 ** i for i in range(8)]
    first = [times[2 * i + (i % 2)] for i in range(4)]
    second = [times[2 * i + 1 - (i % 2)] for i in range(4)]
    c = compare("copy", first, "seed", second)
    assert c.verdict == "within noise" and c.low < 1 < c.high, c


def test_identical_programs_on_a_noisy_machine_are_within_noise_a_thousand_times_in_a_thousand():
    """Launch-to-launch noise of 30% (lognormal), five rounds: the interval holds 1.0 but for about one try in a
    thousand (its confidence); with a fixed seed, none of these."""
    rng = random.Random(7)
    verdicts = [compare("copy", [rng.lognormvariate(0, 0.3) for _ in range(5)], "seed",
                        [rng.lognormvariate(0, 0.3) for _ in range(5)]).verdict for _ in range(1000)]
    assert verdicts.count("within noise") >= 997, verdicts.count("within noise")


def test_the_interval_narrows_with_less_noise_and_more_rounds():
    def width(noise: float, rounds: int) -> float:
        rng = random.Random(3)
        c = compare("a", [rng.lognormvariate(0, noise) for _ in range(rounds)], "b",
                    [1.2 * rng.lognormvariate(0, noise) for _ in range(rounds)])
        return c.high / c.low

    assert width(0.01, 5) < width(0.1, 5) and width(0.05, MAX_ROUNDS) < width(0.05, 3)


def test_rounds_outside_the_table_are_refused():
    with pytest.raises(ValueError, match="rounds"):
        compare("a", [1.0], "b", [1.0])
    with pytest.raises(ValueError, match="rounds"):
        compare("a", [1.0] * (max(T_QUANTILE) + 2), "b", [1.0] * (max(T_QUANTILE) + 2))
    with pytest.raises(ValueError, match="positive"):
        compare("a", [1.0, 0.0], "b", [1.0, 1.0])


def test_cuco_compare_finds_a_copy_of_the_seed_within_noise_of_the_seed(tmp_path):
    """On this machine, while the other tests load it: the copy is never reported faster or slower. An even number
    of rounds: the order is reversed every round, so each program runs first as often as the other, and what running
    first costs on a loaded machine falls on both alike."""
    copy = tmp_path / "copy_of_seed.py"
    shutil.copy(ROOT / "cuco" / "builtin" / "cpu_allgather_matmul" / "seed.py", copy)
    proc = subprocess.run([sys.executable, "-m", "cuco", "compare", "cpu_allgather_matmul", str(copy), "seed",
                           "--rounds", "4", "--iters", "4", "--warmup", "1", "--json"], capture_output=True,
                          text=True, env={**os.environ, "CUCO_HOME": str(tmp_path / "home")})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(proc.stdout)
    assert got["verdict"] == "within noise" and got["low"] < 1 < got["high"], got
    assert len(got["this_ms"]) == len(got["other_ms"]) == 4 and got["shape"] == "cpu"


def test_cuco_compare_refuses_rounds_it_cannot_interval():
    proc = subprocess.run([sys.executable, "-m", "cuco", "compare", "cpu_allgather_matmul", "seed", "seed",
                           "--rounds", "1"], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr == "error: --rounds: expected 2 to 10, got 1\n", proc.stderr
