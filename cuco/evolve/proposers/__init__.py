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
    call_ids: tuple[int, ...] = ()  # the LLM calls that produced it


class ProposalFailed(Exception):
    """This attempt produced nothing usable (the reason is stored); the search may ask again."""


def point_key(strategy: str | None, label: str) -> str:
    """A design point as the search's tried set holds it: two strategies may accept the same point."""
    return f"{strategy}:{label}" if strategy else label


class SearchStopped(Exception):
    """No more proposals: the design space is exhausted or the budget is spent (`failed` False: the search ends
    well), or the proposer cannot go on (an LLM that keeps failing, a key it refuses: `failed` True)."""

    def __init__(self, message: str, failed: bool = False) -> None:
        super().__init__(message)
        self.failed = failed


@dataclass(frozen=True)
class ProposalContext:
    """What a proposer sees: the parent, inspirations, the phase and a seeded random stream."""

    parent: Candidate
    inspirations: list[Candidate]
    phase: str  # "explore" | "exploit"
    rng: object  # random.Random, seeded per proposal index
    tried: set[str]  # design points already in the database, as point_key gives them
    best: Candidate | None = None  # the run's best so far


class Proposer(Protocol):
    name: str

    async def propose(self, ctx: ProposalContext) -> Proposal:
        """A new proposal; raises ProposalFailed (try again) or SearchStopped (stop asking)."""


PROPOSERS: dict[str, type] = {}


def register(cls: type) -> type:
    PROPOSERS[cls.name] = cls
    return cls
