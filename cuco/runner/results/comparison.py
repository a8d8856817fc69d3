"""Whether one program is faster than another, and by how much, against the noise of the machine that timed them.

Two evaluations timed minutes apart on a busy machine differ by more than most optimisations gain: on a loaded CPU a
byte-identical copy of a program reads 1.2x faster than the program now and then, and one design point's median
moves by a third between two evaluations. So a comparison is measured, never read off two records: the programs are
timed in alternating rounds, each round one evaluation (one launch) of each, the order reversed from one round to the
next (A B, B A, A B, ...), so that a machine slowing down or speeding up between launches weighs on both alike.
Each round gives the ratio of the two medians; the speedup is their geometric mean, and its interval the paired
Student t interval of their logarithms at CONFIDENCE, whose spread is the launch-to-launch noise itself. Where the
interval holds 1.0, the difference is within noise.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

CONFIDENCE = 0.999  # two-sided: a copy of a program reads faster or slower than itself once in a thousand
# Student's t at the 0.9995 quantile (two-sided 99.9%) by degrees of freedom (rounds - 1), as printed in any t table.
T_QUANTILE = {1: 636.619, 2: 31.599, 3: 12.924, 4: 8.610, 5: 6.869, 6: 5.959, 7: 5.408, 8: 5.041, 9: 4.781}
MIN_ROUNDS, MAX_ROUNDS = 2, max(T_QUANTILE) + 1


def order(names: list[str], round_index: int) -> list[str]:
    """The order of a round's launches: as given in even rounds, reversed in odd ones."""
    return list(names) if round_index % 2 == 0 else list(reversed(names))


def pending(names: list[str], rounds: int, times: dict[str, list[float]]) -> Iterator[tuple[int, str]]:
    """(round, name) of every launch still to make, in the alternating order: a name with a time for a round already
    (a resumed run) is passed over. The caller appends each launch's time to times[name], or stops."""
    for i in range(rounds):
        for name in order(names, i):
            if len(times[name]) <= i:
                yield i, name


@dataclass
class Comparison:
    """One program (`this`) against another, from the rounds that timed both. `speedup` is the other's time over this
    one's: above 1, this one is faster."""

    this: str
    other: str
    this_ms: list[float]  # this program's median in each round, in the order the rounds ran
    other_ms: list[float]
    speedup: float
    low: float
    high: float

    @property
    def verdict(self) -> str:
        if self.low > 1.0:
            return "faster"
        if self.high < 1.0:
            return "slower"
        return "within noise"

    def words(self) -> str:
        """One line a person reads: the ratio, the verdict, and the interval and rounds it rests on."""
        span = f"{CONFIDENCE:.1%} interval {self.low:.2f}-{self.high:.2f}x, {len(self.this_ms)} alternating rounds"
        return f"{self.this} against {self.other}: {self.speedup:.2f}x, {self.verdict} ({span})"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "verdict": self.verdict, "confidence": CONFIDENCE}


def compare(this: str, this_ms: list[float], other: str, other_ms: list[float]) -> Comparison:
    """The comparison of two programs' medians, round by round (this_ms[i] and other_ms[i] timed in round i)."""
    if len(this_ms) != len(other_ms) or not MIN_ROUNDS <= len(this_ms) <= MAX_ROUNDS:
        raise ValueError(f"a comparison needs {MIN_ROUNDS} to {MAX_ROUNDS} rounds of both programs, got "
                         f"{len(this_ms)} and {len(other_ms)}")
    if min(this_ms + other_ms) <= 0:
        raise ValueError("a median time must be positive")
    logs = [math.log(o / t) for t, o in zip(this_ms, other_ms)]
    mean = statistics.fmean(logs)
    half = T_QUANTILE[len(logs) - 1] * statistics.stdev(logs) / math.sqrt(len(logs))
    return Comparison(this, other, list(this_ms), list(other_ms), math.exp(mean), math.exp(mean - half),
                      math.exp(mean + half))
