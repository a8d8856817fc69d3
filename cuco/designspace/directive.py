"""A directive: the design point a candidate aims at, plus free text; stored with every candidate."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from cuco.designspace.dimensions import DIMENSIONS


@dataclass(frozen=True, order=True)
class DesignPoint:
    backend: str
    placement: str
    sync: str
    issuer: str
    chunks: int

    def __post_init__(self) -> None:
        for name, allowed in DIMENSIONS.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"{name}: {value!r} is not one of {', '.join(map(str, allowed))}")

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
