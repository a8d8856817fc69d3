"""Strict TOML tables: typed access, errors that name the file and the key, unknown keys rejected."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cuco.errors import CucoError


class Section:
    """Typed access to one TOML table, with errors that name the file and the key."""

    def __init__(self, data: dict[str, Any], path: Path, prefix: str) -> None:
        self.data, self.path, self.prefix = data, path, prefix
        self.used: set[str] = set()

    def fail(self, key: str, reason: str) -> CucoError:
        return CucoError(str(self.path), f"{self.prefix}{key}: {reason}")

    def get(self, key: str, typ: type | tuple[type, ...], default: Any = ...) -> Any:
        self.used.add(key)
        if key not in self.data:
            if default is ...:
                raise self.fail(key, "missing required key")
            return default
        value = self.data[key]
        ok = isinstance(value, typ) and not (isinstance(value, bool) and typ in (int, float, (int, float)))
        if not ok:
            want = typ.__name__ if isinstance(typ, type) else " or ".join(t.__name__ for t in typ)
            raise self.fail(key, f"expected {want}, got {type(value).__name__} {value!r}")
        return value

    def table(self, key: str, required: bool = False) -> Section:
        value = self.get(key, dict, ... if required else {})
        return Section(value, self.path, f"{self.prefix}{key}.")

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            raise self.fail(unknown[0], "unknown key")


def load_dataclass(cls: type, sec: Section) -> Any:
    kwargs = {}
    from dataclasses import MISSING

    for name, f in cls.__dataclass_fields__.items():
        default = f.default_factory() if f.default is MISSING and f.default_factory is not MISSING else f.default
        typ: type | tuple[type, ...] = (int, float) if isinstance(default, float) else type(default)
        value = sec.get(name, typ, default)
        kwargs[name] = float(value) if isinstance(default, float) else value
    sec.done()
    obj = cls(**kwargs)
    return obj
