"""Strict TOML tables typed by dataclass annotations: errors name the file and the key, unknown keys are rejected.

Both a TOML value and a `--set KEY=VALUE` string are checked against the field's annotation, so run.toml,
workload.toml and the command line accept exactly the same values.
"""

from __future__ import annotations

import functools
import operator
import sys
import types
import typing
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from cuco.errors import CucoError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class Section:
    """Typed access to one TOML table, with errors that name the file and the key."""

    def __init__(self, data: dict[str, Any], path: Path, prefix: str) -> None:
        self.data, self.path, self.prefix = data, path, prefix
        self.used: set[str] = set()

    def fail(self, key: str, reason: str) -> CucoError:
        return CucoError(str(self.path), f"{self.prefix}{key}: {reason}")

    def get(self, key: str, typ: Any, default: Any = ...) -> Any:
        """The value of KEY checked against TYP (a class, a tuple of classes, or an annotation)."""
        self.used.add(key)
        if key not in self.data:
            if default is ...:
                raise self.fail(key, "missing required key")
            return default
        try:
            return check_value(self.data[key], typ)
        except TypeError as exc:
            raise self.fail(key, str(exc)) from None

    def table(self, key: str, required: bool = False) -> Section:
        value = self.get(key, dict, ... if required else {})
        return Section(value, self.path, f"{self.prefix}{key}.")

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            raise self.fail(unknown[0], "unknown key")


def _name(typ: Any) -> str:
    if isinstance(typ, tuple):
        return " or ".join(_name(t) for t in typ)
    if typ is type(None):
        return "nothing"
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_name(t) for t in typing.get_args(typ) if t is not type(None))
    if origin is not None:
        return f"{origin.__name__} of {' and '.join(_name(a) for a in typing.get_args(typ))}"
    return getattr(typ, "__name__", str(typ))


def check_value(value: Any, typ: Any) -> Any:
    """VALUE if it has type TYP (ints are floats, bools are not numbers); raises TypeError naming both."""
    if isinstance(typ, tuple):
        typ = functools.reduce(operator.or_, typ)
    origin, args = typing.get_origin(typ), typing.get_args(typ)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for alt in (a for a in args if a is not type(None)):
            try:
                return check_value(value, alt)
            except TypeError:
                pass
    elif origin is list or typ is list:
        if isinstance(value, list):
            return [check_value(v, args[0]) for v in value] if args else list(value)
    elif origin is dict or typ is dict:
        if isinstance(value, dict):
            return {k: check_value(v, args[1]) for k, v in value.items()} if args else dict(value)
    elif typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(typ, type) and isinstance(value, typ):
        return value
    raise TypeError(f"expected {_name(typ)}, got {type(value).__name__} {value!r}")


_BOOL_WORDS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


def parse_text(raw: str, typ: Any) -> Any:
    """A command-line string as a value of TYP: TOML syntax, bare words for strings, commas for lists."""
    text = raw.strip()
    options = [a for a in typing.get_args(typ) if a is not type(None)] if typing.get_origin(typ) in (
        typing.Union, types.UnionType) else [typ]
    if text.lower() in ("none", "") and type(None) in typing.get_args(typ):
        return None
    if str in options:
        return raw
    if bool in options and text.lower() in _BOOL_WORDS:
        return _BOOL_WORDS[text.lower()]
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        is_list = any(o is list or typing.get_origin(o) is list for o in options)
        value = [part.strip() for part in text.split(",") if part.strip()] if is_list else raw
    return check_value(value, typ)


def field_types(cls: type) -> dict[str, Any]:
    """The dataclass's fields with their annotations resolved (modules use `from __future__ import annotations`)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls)}


def load_dataclass(cls: type, sec: Section) -> Any:
    """An instance of the dataclass CLS from one table: every key checked against its field's annotation."""
    kwargs = {}
    types_ = field_types(cls)
    for f in fields(cls):
        default = f.default_factory() if f.default is MISSING and f.default_factory is not MISSING else f.default
        kwargs[f.name] = sec.get(f.name, types_[f.name], default)
    sec.done()
    return cls(**kwargs)
