"""Proposers: where new candidates come from. All register the same way (see registry)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from cuco.designspace import Directive
from cuco.evolve.database import Candidate


@dataclass(frozen=True)
class Proposal:
    code: str
    language: str
    directive: Directive
    parent: Candidate | None
    note: str  # what the proposer did, for the live table


@dataclass(frozen=True)
class ProposalContext:
    """What a proposer sees: the parent, inspirations, the phase and a seeded random stream."""

    parent: Candidate
    inspirations: list[Candidate]
    phase: str  # "explore" | "exploit"
    rng: object  # random.Random, seeded per proposal index
    tried: set[str]  # design-point labels already in the database


class Proposer(Protocol):
    name: str

    def propose(self, ctx: ProposalContext) -> Proposal | None: ...


PROPOSERS: dict[str, type] = {}


def register(cls: type) -> type:
    PROPOSERS[cls.name] = cls
    return cls
