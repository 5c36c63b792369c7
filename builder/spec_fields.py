"""Typed readers for build-spec fields; each raises :class:`SpecError` naming the key."""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

from graylane.errors import GraylaneError

__all__ = [
    "SpecError",
    "check_keys",
    "mapping",
    "optional_str",
    "read_bool",
    "read_enum",
    "read_int",
    "read_number",
    "read_path",
    "required",
    "required_str",
]

_E = TypeVar("_E", bound=Enum)


class SpecError(GraylaneError, ValueError):
    """A build spec cannot be used as written; the message says which key and how to fix it."""


def check_keys(raw: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if unknown:
        raise SpecError(
            f"{where}: unknown key(s) {unknown}; the keys allowed here are {sorted(allowed)}"
        )


def required(raw: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in raw or raw[key] is None:
        prefix = "" if where == "spec" else f"{where}."
        raise SpecError(f"{prefix}{key}: required, but missing")
    return raw[key]


def required_str(raw: Mapping[str, Any], key: str, where: str) -> str:
    value = required(raw, key, where)
    if not isinstance(value, str) or not value:
        raise SpecError(f"{key}: must be a non-empty string, got {value!r}")
    return value


def optional_str(raw: Mapping[str, Any], key: str, where: str, default: str) -> str:
    value = raw.get(key, default)
    if not isinstance(value, str) or not value:
        raise SpecError(f"{where}.{key}: must be a non-empty string, got {value!r}")
    return value


def mapping(raw: object, where: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where}: must be a mapping (key: value), got {type(raw).__name__}")
    return raw


def read_int(raw: object, where: str, minimum: int | None = None) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise SpecError(f"{where}: must be an integer, got {raw!r}")
    if minimum is not None and raw < minimum:
        raise SpecError(f"{where}: must be >= {minimum}, got {raw}")
    return raw


def read_number(raw: object, where: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise SpecError(f"{where}: must be a number, got {raw!r}")
    return float(raw)


def read_bool(raw: object, where: str) -> bool:
    if not isinstance(raw, bool):
        raise SpecError(f"{where}: must be true or false, got {raw!r}")
    return raw


def read_path(raw: object, where: str, base_dir: Path) -> Path:
    if not isinstance(raw, str) or not raw:
        raise SpecError(f"{where}: must be a path string, got {raw!r}")
    path = Path(raw).expanduser()
    return path if path.is_absolute() else (base_dir / path).resolve()


def read_enum(raw: object, enum_type: type[_E], where: str) -> _E:
    try:
        return enum_type(raw)
    except ValueError:
        allowed = [str(m.value) for m in enum_type]
        raise SpecError(f"{where}: {raw!r} is not one of {allowed}") from None
