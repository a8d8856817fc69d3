"""Which configured model proposes next: UCB1 on improvement per dollar.

The arms' statistics are derived from the store (each model's calls, the candidates they produced and
those candidates' parents), so a resumed run continues with exactly the state it had: nothing extra to save.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cuco.evolve.database import Database

COST_FLOOR_USD = 1e-3  # a free (local, unpriced) model's proposal counts as costing this much
EXPLORATION = 1.0  # UCB1's constant, in units of the best arm's mean reward


@dataclass
class Arm:
    model: str
    pulls: int = 0
    reward: float = 0.0  # summed: score gained over the parent, per dollar

    @property
    def mean(self) -> float:
        return self.reward / self.pulls if self.pulls else 0.0


def arm_stats(db: Database, models: list[str]) -> dict[str, Arm]:
    arms = {m: Arm(m) for m in models}
    for row in db.proposal_costs():
        arm = arms.get(row["model"])
        if arm is None or (row["candidate_id"] is not None and row["status"] != "done"):
            continue  # another model's, or still being evaluated
        arm.pulls += 1
        if row["ok"] and row["score"] is not None and row["parent"] is not None:
            arm.reward += max(0.0, row["score"] - row["parent"]) / max(row["cost"] or 0.0, COST_FLOOR_USD)
    return arms


def choose(arms: dict[str, Arm]) -> str:
    """Every model once, then the best upper confidence bound."""
    for model, arm in arms.items():
        if arm.pulls == 0:
            return model
    total = sum(a.pulls for a in arms.values())
    scale = max((a.mean for a in arms.values()), default=0.0) or 1.0
    return max(arms.values(), key=lambda a: a.mean + EXPLORATION * scale * math.sqrt(2 * math.log(total) / a.pulls)
               ).model
