"""Admission at the edge, pure: who calls, how fast, how large, how urgent.

Room: ``logic/`` of the gateway: the rules (keys and their tenants, priorities,
timeouts, the replica's limits). The counters they are applied to (token buckets per
key, calls in flight) are the gateway's state (:mod:`~graylane.services.gateway.state`).

- **API keys.** ``Authorization: Bearer <key>``; each key belongs to a tenant and has a
  role (``infer``: may call the inference endpoints, the only role so far) and its own
  token bucket. Keys come from ``GRAYLANE_GATEWAY_KEYS`` and/or a file, one
  ``KEY:ROLE:TENANT[:RATE_PER_S[:BURST[:PRIORITIES[:TAGS]]]]`` entry per line or comma
  (``#`` comments). Keys are held as SHA-256 digests; logs and metrics name the tenant,
  never a key. The keys committed for local clusters (:data:`DEVELOPMENT_KEYS`) are
  refused by a gateway that listens beyond loopback.
- **Identity decides.** ``PRIORITIES`` (``+``-separated, e.g. ``critical+standard``;
  default ``standard``) are the priorities a key may ask for, ``TAGS`` (``+``-separated
  names, ``*`` for any) the request tags it may set; anything else is refused (403). The
  tenant travels as the reserved ``tenant`` tag (:data:`~graylane.request_tags.TENANT_TAG`),
  which no caller may set, so a tag rule ``tenant=<name>`` matches that tenant's calls only.
- **Rate limits.** A token bucket per key: ``RATE_PER_S`` tokens a second, at most
  ``BURST`` saved up; a call takes one token, and a call without one is answered 429
  with ``Retry-After`` (when the next token comes). Buckets live in each replica, so the
  limit is split (:func:`split_rate`): with ``replicas`` N (the most replicas that run at
  once: the HPA's ``maxReplicas``) each replica's bucket gets 1/N of the rate and of the
  burst (at least one token), and a key's limit holds across the replicas together.
- **Priority.** ``x-graylane-priority: critical | standard | sheddable`` (the Gateway
  API Inference Extension's criticalities; default standard) rides along as the
  request's ``priority`` tag, so tag rules and workers can tell traffic apart. The
  gateway's own overload gate refuses sheddable calls first: sheddable ones are admitted
  while fewer than ``sheddable_share`` of ``max_in_flight`` calls run, standard ones
  while fewer than ``max_in_flight``, critical ones up to ``critical_headroom`` more.
- **Fair share.** A place in the gate is taken before the body is read, so the gate
  bounds the bodies held too. One tenant holds at most ``tenant_share`` of
  ``max_in_flight``; once the gate is ``fair_from`` full, a tenant already holding its
  fair share (``max_in_flight`` over the tenants running calls) is refused (429: its own
  doing, unlike a full replica's 503) until others had theirs: one tenant cannot starve
  the rest (:func:`gate_verdict`).
- **Deadlines.** ``x-graylane-timeout-ms`` or a body's ``timeout`` (seconds) bound how
  long the gateway waits and become the request's deadline (workers shed what cannot
  finish in time); both are capped by ``max_timeout_s``.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from graylane.errors import GraylaneError
from graylane.priority import Priority

__all__ = [
    "ANY_TAG",
    "DEVELOPMENT_KEYS",
    "MIN_KEY_LENGTH",
    "ApiKeyError",
    "CallerRole",
    "GateVerdict",
    "GatewayLimits",
    "KeyRing",
    "Tenant",
    "exposure_problem",
    "gate_verdict",
    "parse_api_keys",
    "parse_priority",
    "parse_timeout",
    "split_rate",
]

MIN_KEY_LENGTH = 16
ANY_TAG = "*"
"""In a key's TAGS: it may set any tag that is not reserved."""

DEVELOPMENT_KEYS: frozenset[str] = frozenset(
    {
        "local-gateway-key-0123456",  # deploy/k8s/overlays/local/secrets.yaml
    }
)
"""Keys committed to this repository for local clusters: refused off loopback."""


class ApiKeyError(GraylaneError, ValueError):
    """The API key configuration cannot be used."""


class CallerRole(Enum):
    """What a key may do."""

    INFER = "infer"
    """Call the inference endpoints (OpenAI and Open Inference Protocol)."""


@dataclass(frozen=True)
class Tenant:
    """Who a key belongs to, how fast it may call (0 = the gateway's default rate), and
    what it may ask for: its priorities and the request tags it may set."""

    name: str
    role: CallerRole
    rate_per_s: float = 0.0
    burst: int = 0
    priorities: frozenset[Priority] = frozenset({Priority.STANDARD})
    tags: frozenset[str] = frozenset()
    """Tag names the key may set (``*``: any that is not reserved)."""

    def may_tag(self, name: str) -> bool:
        return ANY_TAG in self.tags or name in self.tags


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


_ENTRY = "KEY:ROLE:TENANT[:RATE_PER_S[:BURST[:PRIORITIES[:TAGS]]]]"


def _priorities(text: str, shown: str) -> frozenset[Priority]:
    if not text:
        return frozenset({Priority.STANDARD})
    try:
        return frozenset(Priority(p.strip().lower()) for p in text.split("+") if p.strip())
    except ValueError:
        allowed = ", ".join(p.value for p in Priority)
        raise ApiKeyError(
            f"API key entry {shown}: priorities must be '+'-separated names of {allowed}"
        ) from None


def parse_api_keys(text: str) -> dict[str, Tenant]:
    """``KEY:ROLE:TENANT[:RATE_PER_S[:BURST[:PRIORITIES[:TAGS]]]]`` entries ->
    {sha256(key): tenant}."""
    keys: dict[str, Tenant] = {}
    for raw in text.replace(",", "\n").splitlines():
        entry = raw.split("#", 1)[0].strip()
        if not entry:
            continue
        parts = [p.strip() for p in entry.split(":")]
        shown = f"{parts[0][:4]}..."
        if not 3 <= len(parts) <= 7 or not parts[0] or not parts[2]:
            raise ApiKeyError(f"API key entry {shown} must be {_ENTRY}")
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
        priorities = _priorities(parts[5] if len(parts) > 5 else "", shown)
        tags = frozenset(t.strip() for t in (parts[6] if len(parts) > 6 else "").split("+"))
        keys[digest] = Tenant(parts[2], role, rate, burst, priorities, tags - {""})
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
        self._development = {d for d in map(_digest, DEVELOPMENT_KEYS) if d in self._keys}

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

    def development_tenants(self) -> list[str]:
        """Tenants whose key is one committed to this repository (:data:`DEVELOPMENT_KEYS`)."""
        return sorted(self._keys[d].name for d in self._development)


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
    tenant_share: float = 0.5
    """The most of ``max_in_flight`` one tenant may hold."""
    fair_from: float = 0.5
    """From this share of ``max_in_flight`` on, a tenant past its fair share is refused."""
    max_buffered_bytes: int = 32 * 1024 * 1024
    """Request bodies this replica holds while reading them, all callers together (503
    above); one tenant may hold ``tenant_share`` of it."""
    max_json_depth: int = 32
    """Deepest nesting of a JSON body (400 beyond)."""
    max_json_containers: int = 32_768
    """Most ``{`` and ``[`` in one JSON body, strings included (400 beyond, unparsed):
    bounds what a parse makes of a body."""
    drain_s: float = 5.0
    """Longest the gateway reads (and drops) the body of a call it refused unread."""
    template_timeout_s: float = 2.0
    """Longest a model's chat template may render one conversation (400 beyond)."""
    replicas: int = 1
    """Replicas that may run at once: each holds 1/replicas of every key's rate limit."""
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
        if not 0 < self.tenant_share <= 1 or not 0 <= self.fair_from <= 1:
            raise ValueError("tenant_share must be in (0, 1] and fair_from in [0, 1]")
        if self.replicas < 1 or self.max_buffered_bytes < self.max_body_bytes:
            raise ValueError("replicas must be >= 1, max_buffered_bytes >= max_body_bytes")
        if min(self.max_json_depth, self.max_json_containers) < 2:
            raise ValueError("JSON bounds must be >= 2")
        if self.template_timeout_s <= 0:
            raise ValueError("template_timeout_s must be > 0")

    @property
    def tenant_cap(self) -> int:
        """The most calls one tenant may have in flight on this replica."""
        return max(1, int(self.max_in_flight * self.tenant_share))

    @property
    def tenant_buffered_bytes(self) -> int:
        """The most body bytes one tenant may have this replica hold while reading."""
        return max(self.max_body_bytes, int(self.max_buffered_bytes * self.tenant_share))


def split_rate(rate_per_s: float, burst: int, replicas: int) -> tuple[float, int]:
    """One replica's share of a key's limit (rate, burst) when ``replicas`` serve it."""
    return rate_per_s / replicas, max(1, burst // replicas)


class GateVerdict(Enum):
    """Whether a call may take a place among a replica's running calls, and why not."""

    ADMIT = "admit"
    REPLICA_FULL = "replica_full"
    """The replica runs as many calls of this priority as it may."""
    TENANT_CAP = "tenant_cap"
    """The tenant holds ``tenant_share`` of the gate."""
    FAIR_SHARE = "fair_share"
    """The gate is filling and the tenant holds its fair share already."""


def gate_verdict(
    *,
    running: int,
    priority_cap: int,
    tenant_running: int,
    tenants_running: int,
    limits: GatewayLimits,
) -> GateVerdict:
    """Whether one more call of a tenant enters the gate (pure).

    ``running``: calls in the gate; ``priority_cap``: the gate's cap for the call's
    priority; ``tenant_running``: the tenant's own calls in it; ``tenants_running``:
    tenants with a call in it, this one counted. Order: the replica's cap, the tenant's
    cap, then, once ``fair_from`` of the gate is taken, the fair share
    (``max_in_flight`` / ``tenants_running``, at least one).
    """
    if running >= priority_cap:
        return GateVerdict.REPLICA_FULL
    if tenant_running >= limits.tenant_cap:
        return GateVerdict.TENANT_CAP
    if running >= limits.max_in_flight * limits.fair_from:
        fair = max(1, limits.max_in_flight // max(1, tenants_running))
        if tenant_running >= fair:
            return GateVerdict.FAIR_SHARE
    return GateVerdict.ADMIT


def _is_loopback(host: str) -> bool:
    name = host.strip().strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # a host name: may resolve to anything


def exposure_problem(host: str, keys: KeyRing | None, *, forced: bool = False) -> str | None:
    """Why a gateway must not listen on ``host`` with ``keys`` (None: it may).

    Beyond loopback, an open gateway (no keys) needs ``forced``, and the keys committed to
    this repository for local clusters (:data:`DEVELOPMENT_KEYS`) are refused outright:
    anyone who has read the repository holds them.
    """
    if _is_loopback(host):
        return None
    if keys is None:
        if forced:
            return None
        return (
            f"refusing --no-auth on {host!r}: anyone who reaches the port could call; bind "
            "127.0.0.1, give API keys, or pass --no-auth-beyond-loopback on purpose"
        )
    development = keys.development_tenants()
    if development:
        return (
            f"refusing to listen on {host!r} with the development keys committed to this "
            f"repository (tenants {', '.join(development)}): use random keys, e.g. "
            "`openssl rand -hex 16`"
        )
    return None
