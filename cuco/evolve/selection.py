"""Parent selection on records (best first), never on cursors."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def power_law(ranked: Sequence[T], rng: random.Random, alpha: float = 1.0) -> T:
    """Rank r (0 = best) drawn with probability proportional to (r + 1) ** -alpha."""
    weights = [(r + 1) ** -alpha for r in range(len(ranked))]
    return rng.choices(list(ranked), weights=weights, k=1)[0]


def weighted(ranked: Sequence[T], rng: random.Random, scores: Sequence[float], temperature: float = 0.1) -> T:
    """Softmax of the scores relative to the best: better candidates likelier, none excluded."""
    top = max(scores)
    weights = [math.exp((s - top) / max(temperature, 1e-9)) for s in scores]
    return rng.choices(list(ranked), weights=weights, k=1)[0]


def hill_climbing(ranked: Sequence[T], rng: random.Random) -> T:
    return ranked[0]


SELECTIONS: dict[str, Callable] = {"power_law": power_law, "weighted": weighted, "hill_climbing": hill_climbing}
