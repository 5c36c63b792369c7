"""Admission at the edge, pure: who calls, how fast, how large, how urgent.

Room: ``logic/`` of the gateway: the rules (keys and their tenants, priorities,
timeouts, the replica's limits). The counters they are applied to (token buckets per
key, calls in flight) are the gateway's state (:mod:`~graylane.services.gateway.state`).

- **API keys.** ``Authorization: Bearer <key>``; each key belongs to a tenant and has a
  role (``infer``: may call the inference endpoints, the only role so far) and its own
  token bucket. Keys come from ``GRAYLANE_GATEWAY_KEYS`` and/or a file, one
  ``KEY:ROLE:TENANT[:RATE_PER_S[:BURST]]`` entry per line or comma (``#`` comments).
  Keys are held as SHA-256 digests; logs and metrics name the tenant, never a key.
- **Rate limits.** A token bucket per key: ``RATE_PER_S`` tokens a second, at most
  ``BURST`` saved up; a call takes one token, and a call without one is answered 429
  with ``Retry-After`` (when the next token comes).
- **Priority.** ``x-graylane-priority: critical | standard | sheddable`` (the Gateway
  API Inference Extension's criticalities; default standard) rides along as the
  request's ``priority`` tag, so tag rules and workers can tell traffic apart. The
  gateway's own overload gate refuses sheddable calls first: sheddable ones are admitted
  while fewer than ``sheddable_share`` of ``max_in_flight`` calls run, standard ones
  while fewer than ``max_in_flight``, critical ones up to ``critical_headroom`` more.
- **Deadlines.** ``x-graylane-timeout-ms`` or a body's ``timeout`` (seconds) bound how
  long the gateway waits and become the request's deadline (workers shed what cannot
  finish in time); both are capped by ``max_timeout_s``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from graylane.errors import GraylaneError
from graylane.priority import PRIORITY_TAG, Priority

__all__ = [
    "MIN_KEY_LENGTH",
    "PRIORITY_TAG",
    "ApiKeyError",
    "CallerRole",
    "GatewayLimits",
    "KeyRing",
    "Priority",
    "Tenant",
    "parse_api_keys",
    "parse_priority",
    "parse_timeout",
]

MIN_KEY_LENGTH = 16


class ApiKeyError(GraylaneError, ValueError):
    """The API key configuration cannot be used."""


class CallerRole(Enum):
    """What a key may do."""

    INFER = "infer"
    """Call the inference endpoints (OpenAI and Open Inference Protocol)."""


@dataclass(frozen=True)
class Tenant:
    """Who a key belongs to and how fast it may call (0 = the gateway's default rate)."""

    name: str
    role: CallerRole
    rate_per_s: float = 0.0
    burst: int = 0


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def parse_api_keys(text: str) -> dict[str, Tenant]:
    """``KEY:ROLE:TENANT[:RATE_PER_S[:BURST]]`` entries -> {sha256(key): tenant}."""
    keys: dict[str, Tenant] = {}
    for raw in text.replace(",", "\n").splitlines():
        entry = raw.split("#", 1)[0].strip()
        if not entry:
            continue
        parts = [p.strip() for p in entry.split(":")]
        shown = f"{parts[0][:4]}..."
        if not 3 <= len(parts) <= 5 or not parts[0] or not parts[2]:
            raise ApiKeyError(f"API key entry {shown} must be KEY:ROLE:TENANT[:RATE_PER_S[:BURST]]")
        try:
            role = CallerRole(parts[1].lower())
        except ValueError:
            roles = ", ".join(r.value for r in CallerRole)
            raise ApiKeyError(
                f"API key entry {shown}: unknown role {parts[1]!r} ({roles})"
            ) from None
        try:
            rate = float(parts[3]) if len(parts) > 3 and parts[3] else 0.0
            burst = int(parts[4]) if len(parts) > 4 and parts[4] else 0
        except ValueError:
            raise ApiKeyError(f"API key entry {shown}: rate and burst must be numbers") from None
        if rate < 0 or not math.isfinite(rate) or burst < 0:
            raise ApiKeyError(f"API key entry {shown}: rate and burst must be >= 0")
        digest = _digest(parts[0])
        if digest in keys:
            raise ApiKeyError(f"API key entry {shown} appears twice")
        if len(parts[0]) < MIN_KEY_LENGTH:
            raise ApiKeyError(
                f"the key of tenant {parts[2]!r} has {len(parts[0])} characters, fewer than "
                f"{MIN_KEY_LENGTH}: use random keys, e.g. `openssl rand -hex 16`"
            )
        keys[digest] = Tenant(parts[2], role, rate, burst)
    return keys


class KeyRing:
    """The configured keys (as digests) and the tenant of each."""

    def __init__(self, keys: Mapping[str, Tenant]) -> None:
        if not keys:
            raise ApiKeyError(
                "no API keys configured; set GRAYLANE_GATEWAY_KEYS "
                "('KEY:infer:TENANT[:RATE_PER_S[:BURST]]', comma-separated) or pass "
                "--keys-file, or run an open gateway with --no-auth on purpose"
            )
        self._keys = dict(keys)

    @classmethod
    def from_sources(cls, env_value: str | None, file: Path | None) -> KeyRing:
        text = env_value or ""
        if file is not None:
            try:
                text += "\n" + file.read_text(encoding="utf-8")
            except OSError as exc:
                raise ApiKeyError(f"cannot read API keys file {file}: {exc}") from None
        return cls(parse_api_keys(text))

    def tenant_of(self, authorization: str | None) -> tuple[str, Tenant] | None:
        """(key digest, tenant) of an ``Authorization: Bearer <key>`` value; None if unknown."""
        if not authorization:
            return None
        scheme, _, key = authorization.strip().partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            return None
        digest = _digest(key)
        tenant = self._keys.get(digest)
        return None if tenant is None else (digest, tenant)

    def __len__(self) -> int:
        return len(self._keys)


def parse_priority(value: str | None) -> Priority:
    """The priority a header names (``standard`` when absent); ValueError when unknown."""
    if value is None or not value.strip():
        return Priority.STANDARD
    try:
        return Priority(value.strip().lower())
    except ValueError:
        allowed = ", ".join(p.value for p in Priority)
        raise ValueError(f"priority {value[:32]!r} is not one of {allowed}") from None


def parse_timeout(
    header_ms: str | None, body_s: object, *, default_s: float, max_s: float
) -> tuple[float, bool]:
    """(seconds to wait, whether the caller set it): the header, else the body's
    ``timeout``, else ``default_s``; capped at ``max_s``. ValueError for a bad value."""
    chosen: float | None = None
    if header_ms is not None and header_ms.strip():
        try:
            chosen = float(header_ms) / 1000.0
        except ValueError:
            raise ValueError(f"x-graylane-timeout-ms {header_ms[:32]!r} is not a number") from None
    elif body_s is not None:
        if isinstance(body_s, bool) or not isinstance(body_s, int | float):
            raise ValueError("timeout must be a number of seconds")
        chosen = float(body_s)
    if chosen is None:
        return min(default_s, max_s), False
    if not math.isfinite(chosen) or chosen <= 0:
        raise ValueError("a timeout must be a positive number")
    return min(chosen, max_s), True


@dataclass(frozen=True, kw_only=True)
class GatewayLimits:
    """What one gateway replica accepts."""

    max_body_bytes: int = 1024 * 1024
    """Largest request body; a larger one is 413 before it is read."""
    max_prompt_chars: int = 32_768
    max_messages: int = 256
    max_tokens: int = 4096
    """Largest ``max_tokens`` a call may ask for."""
    default_max_tokens: int = 128
    """``max_tokens`` of a chat completion that names none."""
    default_timeout_s: float = 60.0
    max_timeout_s: float = 600.0
    default_rate_per_s: float = 50.0
    """Token-bucket rate of a key that names none."""
    default_burst: int = 100
    max_in_flight: int = 256
    """Calls this replica runs at once (standard priority); beyond it: 503."""
    sheddable_share: float = 0.75
    critical_headroom: float = 0.25
    retry_after_s: int = 1
    """``Retry-After`` of an overload answer."""

    def __post_init__(self) -> None:
        if min(self.max_body_bytes, self.max_tokens, self.default_max_tokens) < 1:
            raise ValueError("gateway size limits must be >= 1")
        if self.max_in_flight < 1 or not 0 < self.sheddable_share <= 1:
            raise ValueError("max_in_flight must be >= 1 and sheddable_share in (0, 1]")
        if self.default_rate_per_s <= 0 or self.default_burst < 1:
            raise ValueError("the default rate must be > 0 and the burst >= 1")
        if not 0 < self.default_timeout_s <= self.max_timeout_s:
            raise ValueError("timeouts must be > 0, the default at most the maximum")
