"""A directive: the design point a candidate aims at, plus free text; stored with every candidate."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from cuco.designspace.dimensions import CHUNK_CHOICES, DIMENSIONS, ENUMS, Backend, Issuer, Placement, SyncScope


@dataclass(frozen=True, order=True)
class DesignPoint:
    """A point of the design space; built from strings (TOML, JSON, an LLM's reply) or the enums alike."""

    backend: Backend
    placement: Placement
    sync: SyncScope
    issuer: Issuer
    chunks: int

    def __post_init__(self) -> None:
        for name, kind in ENUMS.items():
            value = getattr(self, name)
            try:
                object.__setattr__(self, name, kind(value))
            except ValueError:
                raise ValueError(f"{name}: {value!r} is not one of {', '.join(DIMENSIONS[name])}") from None
        if self.chunks not in CHUNK_CHOICES:
            raise ValueError(f"chunks: {self.chunks!r} is not one of {', '.join(map(str, CHUNK_CHOICES))}")

    def replace(self, **kw: Any) -> DesignPoint:
        return DesignPoint(**{**asdict(self), **kw})

    def label(self) -> str:
        return f"{self.backend}/{self.placement}/{self.sync}/{self.issuer}/{self.chunks}"


@dataclass(frozen=True)
class Directive:
    point: DesignPoint | None  # None for free-form code that states no design point
    text: str = ""
    strategy: str | None = None  # the workload strategy kernel it instantiates, if any
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"point": asdict(self.point) if self.point else None, "text": self.text,
                           "strategy": self.strategy, "extra": self.extra}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Directive:
        d = json.loads(text)
        return cls(DesignPoint(**d["point"]) if d.get("point") else None, d.get("text", ""), d.get("strategy"),
                   d.get("extra", {}))
