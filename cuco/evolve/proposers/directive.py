"""The directive proposer: no LLM. Mutates and crosses design points of the workload's strategy kernels.

Exploring, it takes wide steps (several dimensions at once, or a fresh point); exploiting, it moves to a
neighbour of the parent (one dimension, chunk counts one step). Crossover mixes the parent's point with
an inspiration's. Only points the strategy accepts and the constraints allow are proposed.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from cuco.designspace import DesignPoint, Directive
from cuco.designspace.dimensions import DIMENSIONS
from cuco.evolve.proposers import Proposal, ProposalContext, SearchStopped, point_key, register
from cuco.evolve.strategy import directive_for, materialize
from cuco.language import language_of
from cuco.workload.spec import StrategySpec, WorkloadSpec

TRIES = 64


@register
class DirectiveProposer:
    name = "directive"

    def __init__(self, spec: WorkloadSpec, machine: dict[str, Any] | None = None, **_: Any) -> None:
        if not spec.strategies:
            raise ValueError(f"workload {spec.name} ships no strategy kernels ([strategies] in workload.toml): "
                             "the directive proposer has nothing to search")
        self.spec = spec
        self.points: dict[str, list[DesignPoint]] = {n: s.points(machine) for n, s in spec.strategies.items()}
        self.language = {n: language_of(s.path) for n, s in spec.strategies.items()}

    def _strategy_of(self, ctx: ProposalContext) -> StrategySpec:
        d = Directive.from_json(ctx.parent.directive) if ctx.parent.directive else None
        if d and d.strategy in self.spec.strategies:
            return self.spec.strategies[d.strategy]
        names = sorted(self.spec.strategies)
        return self.spec.strategies[names[ctx.rng.randrange(len(names))]]

    def _neighbours(self, p: DesignPoint, allowed: list[DesignPoint], wide: bool, rng) -> list[DesignPoint]:
        """Points that differ from p in one dimension (chunks: one step), or in 2-3 dimensions when wide."""
        chunks = DIMENSIONS["chunks"]

        def dist(q: DesignPoint) -> int:
            d = sum(getattr(q, k) != getattr(p, k) for k in ("backend", "placement", "sync", "issuer"))
            if q.chunks != p.chunks:
                d += 1 if wide or abs(chunks.index(q.chunks) - chunks.index(p.chunks)) == 1 else 3
            return d

        want = (2, 3) if wide else (1,)
        return [q for q in allowed if dist(q) in want]

    def _fresh(self, name: str, ctx: ProposalContext) -> list[DesignPoint]:
        return [p for p in self.points[name] if point_key(name, p.label()) not in ctx.tried]

    async def propose(self, ctx: ProposalContext) -> Proposal:
        strategy = self._strategy_of(ctx)
        fresh = self._fresh(strategy.name, ctx)
        if not fresh:  # the parent's strategy is spent: go on in another that has untried points
            others = [n for n in sorted(self.spec.strategies) if self._fresh(n, ctx)]
            if not others:
                raise SearchStopped("every design point of every strategy has been tried")
            strategy = self.spec.strategies[others[ctx.rng.randrange(len(others))]]
            fresh = self._fresh(strategy.name, ctx)
        allowed = self.points[strategy.name]
        rng = ctx.rng
        parent_point = None
        if ctx.parent.directive:
            d = Directive.from_json(ctx.parent.directive)
            if d.strategy == strategy.name and d.point in allowed:
                parent_point = d.point
        for _ in range(TRIES):
            if parent_point is None:
                point, how = rng.choice(fresh), "first point of the strategy"
            elif ctx.inspirations and rng.random() < (0.3 if ctx.phase == "explore" else 0.15):
                other = self._inspiration_point(ctx, strategy.name)
                if other is None:
                    continue
                point = DesignPoint(**{k: getattr(parent_point if rng.random() < 0.5 else other, k)
                                       for k in asdict(parent_point)})
                how = f"crossover with {other.label()}"
            elif ctx.phase == "explore" and rng.random() < 0.3:
                point, how = rng.choice(fresh), "random restart"
            else:
                near = self._neighbours(parent_point, allowed, ctx.phase == "explore", rng)
                near = [q for q in near if point_key(strategy.name, q.label()) not in ctx.tried] or near
                if not near:
                    continue
                point, how = rng.choice(near), ("wide step" if ctx.phase == "explore" else "neighbour")
            if point in allowed and point_key(strategy.name, point.label()) not in ctx.tried:
                text = f"{how} from {parent_point.label() if parent_point else 'the seed'}"
                return Proposal(materialize(strategy, point), self.language[strategy.name],
                                directive_for(strategy, point, text), ctx.parent, text)
        point = rng.choice(fresh)  # the neighbourhood is exhausted: anything untried
        return Proposal(materialize(strategy, point), self.language[strategy.name],
                        directive_for(strategy, point, "untried point (neighbourhood exhausted)"), ctx.parent,
                        "untried point")

    def _inspiration_point(self, ctx: ProposalContext, strategy: str) -> DesignPoint | None:
        for c in ctx.inspirations:
            if c.directive:
                d = Directive.from_json(c.directive)
                if d.strategy == strategy and d.point is not None:
                    return d.point
        return None
