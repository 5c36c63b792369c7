"""Ids and names that fit their SQL column: kept as they are, or hashed, never cut silently.

A value longer than its column (PostgreSQL refuses it; SQLite would keep it whole)
is stored as a readable prefix, ``~`` and the first 16 hex digits of its sha256:
stable (the same value always maps to the same key, so inserts stay idempotent)
and distinct for values that share a long prefix. Pure; no SQL import.
"""

from __future__ import annotations

import hashlib

__all__ = ["HASH_DIGITS", "fit"]

HASH_DIGITS = 16
_MARK = "~"


def fit(value: str, limit: int) -> str:
    """``value`` if it has at most ``limit`` characters, else its stable hashed form."""
    if limit <= HASH_DIGITS + len(_MARK):
        raise ValueError(f"a column of {limit} characters cannot hold a hashed id")
    if len(value) <= limit:
        return value
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_DIGITS]
    return f"{value[: limit - HASH_DIGITS - len(_MARK)]}{_MARK}{digest}"
