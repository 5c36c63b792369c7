"""A model's routing: the plan the policy engine decides, the table the router serves
from, and the routing function.

**The plan** (:class:`RoutingPlan`): everything the policy engine decides about a model's
routing, in one value: the per-version weights and shadow settings (the split), and the
model's cohort rules (tag rules, kept in the order they were added; adding a rule under
an existing name replaces it in place) and whether pins are allowed. During a rollout the
baseline stays the stable version and the candidate is the weighted one; after a
promotion the candidate is the stable version and takes every bucket. A new split
(:func:`split_plan`, :func:`stable_plan`) leaves the cohort rules to the model's last plan
(the policy engine's ``Routing`` carries them over); the rules change only through
:meth:`RoutingPlan.with_rule`, :meth:`RoutingPlan.without_rule` and
:meth:`RoutingPlan.with_pinning`, or the pure functions over rules :func:`with_rule`,
:func:`without_rule` and :func:`check_rules` (the control plane edits its stored
configuration with them). :func:`route_table_for` turns a plan into a table and
:func:`plan_of_table` a table back into its plan (restore).

**The table** (:class:`RouteTable`): the plan's weights as sticky bucket ranges, with the
plan's cohort rules and pinning. ``bucket = hash(routing_key) mod 10000``. Non-stable
versions own contiguous ranges starting at bucket 0, in a fixed order; the stable version
owns the rest. Raising a candidate's weight only extends its range upward, so a key that
reached the candidate at weight ``w`` stays on it at every weight ``>= w``.

**The routing function** (:func:`route`): (table, request facts) -> where the request
goes (a :class:`RouteDecision`). Order of precedence: tag rules (the first match wins),
then an explicit version pin (when the table allows pinning), then the sticky bucket
ranges. Without a table, the model's stable version from configuration serves.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

from graylane.errors import ErrorCode, GraylaneError

__all__ = [
    "InvalidRouteRule",
    "RoutingPlan",
    "UnknownRouteRule",
    "VersionWeight",
    "check_rules",
    "plan_of_table",
    "route_table_for",
    "split_plan",
    "stable_plan",
    "weights_for",
    "with_rule",
    "without_rule",
]


BUCKETS = 10_000


class WeightError(GraylaneError, ValueError):
    """Weights that cannot be turned into bucket ranges."""


@dataclass(frozen=True, order=True)
class BucketRange:
    """Half-open range ``[start, end)`` of buckets."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end <= BUCKETS:
            raise WeightError(f"bucket range [{self.start}, {self.end}) is outside 0..{BUCKETS}")

    def __contains__(self, bucket: object) -> bool:
        return isinstance(bucket, int) and self.start <= bucket < self.end

    @property
    def size(self) -> int:
        return self.end - self.start


def _hash64(data: str, salt: bytes) -> int:
    digest = hashlib.blake2b(data.encode("utf-8"), digest_size=8, key=salt).digest()
    return int.from_bytes(digest, "big")


def bucket_of(routing_key: str) -> int:
    """The sticky bucket of a routing key (stable across processes and versions)."""
    return _hash64(routing_key, b"graylane-route") % BUCKETS


def sample_fraction(request_id: str, salt: str = "shadow") -> float:
    """A stable pseudo-random number in [0, 1) for sampling (e.g. shadow copies)."""
    return _hash64(request_id, salt.encode("utf-8")[:64]) / 2.0**64


def percent_to_buckets(percent: float) -> int:
    if not 0.0 <= percent <= 100.0:
        raise WeightError(f"weight {percent}% is outside 0..100")
    return round(percent * BUCKETS / 100.0)


def assign_ranges(
    stable_version: str, others: Sequence[tuple[str, float]]
) -> dict[str, BucketRange]:
    """Contiguous ranges for ``others`` (in the given order) from bucket 0 up.

    The stable version gets the remaining buckets at the top. Weights are in
    percent; their sum may not exceed 100.
    """
    ranges: dict[str, BucketRange] = {}
    start = 0
    for version, percent in others:
        if version == stable_version:
            raise WeightError(f"version {version} is both stable and weighted")
        if version in ranges:
            raise WeightError(f"version {version} is weighted twice")
        size = percent_to_buckets(percent)
        if start + size > BUCKETS:
            raise WeightError("weights add up to more than 100%")
        ranges[version] = BucketRange(start, start + size)
        start += size
    ranges[stable_version] = BucketRange(start, BUCKETS)
    return ranges


class RouteReason(Enum):
    RULE = "rule"
    PINNED = "pinned"
    BUCKET = "bucket"
    NO_TABLE = "no-table"


class UnknownPinnedVersion(GraylaneError, LookupError):
    """A request pinned a version the model does not route to."""


@dataclass(frozen=True)
class RoutingRule:
    """Requests whose tags contain every ``match_tags`` pair go to ``version``."""

    name: str
    match_tags: tuple[tuple[str, str], ...]
    version: str

    def matches(self, tags: Mapping[str, str]) -> bool:
        return bool(self.match_tags) and all(tags.get(k) == v for k, v in self.match_tags)


@dataclass(frozen=True)
class VersionRoute:
    version: str
    weight_percent: float
    ranges: tuple[BucketRange, ...]


@dataclass(frozen=True, kw_only=True)
class RouteTable:
    model: str
    stable_version: str
    routes: tuple[VersionRoute, ...] = ()
    rules: tuple[RoutingRule, ...] = ()
    shadow_version: str | None = None
    shadow_share: float = 0.0
    epoch: int = 0
    allow_pinning: bool = False
    rollout_id: str = ""
    reason: str = ""

    def versions(self) -> frozenset[str]:
        found = {self.stable_version, *(r.version for r in self.routes)}
        found.update(rule.version for rule in self.rules)
        if self.shadow_version:
            found.add(self.shadow_version)
        return frozenset(found)

    def weight_of(self, version: str) -> float:
        return sum(r.weight_percent for r in self.routes if r.version == version)


@dataclass(frozen=True)
class RouteDecision:
    version: str
    reason: RouteReason
    bucket: int
    rule: str | None = None
    shadow_version: str | None = None
    epoch: int = 0


@dataclass(frozen=True)
class RoutingRequest:
    """What the router knows of a request when it routes it."""

    request_id: str
    routing_key: str
    tags: Mapping[str, str] = field(default_factory=dict)
    pinned_version: str = ""


def table_for_weights(
    *,
    model: str,
    stable_version: str,
    weights: Sequence[tuple[str, float]] = (),
    rules: Sequence[RoutingRule] = (),
    shadow_version: str | None = None,
    shadow_share: float = 0.0,
    epoch: int = 0,
    allow_pinning: bool = False,
    rollout_id: str = "",
    reason: str = "",
) -> RouteTable:
    """Build a table from weights in percent; the stable version gets the rest."""
    ranges = assign_ranges(stable_version, weights)
    total = sum(w for _, w in weights)
    routes = (
        *tuple(VersionRoute(v, w, (ranges[v],)) for v, w in weights),
        VersionRoute(stable_version, max(0.0, 100.0 - total), (ranges[stable_version],)),
    )
    if not 0.0 <= shadow_share <= 1.0:
        raise ValueError(f"shadow share {shadow_share} is outside 0..1")
    return RouteTable(
        model=model,
        stable_version=stable_version,
        routes=routes,
        rules=tuple(rules),
        shadow_version=shadow_version,
        shadow_share=shadow_share,
        epoch=epoch,
        allow_pinning=allow_pinning,
        rollout_id=rollout_id,
        reason=reason,
    )


def route(table: RouteTable, facts: RoutingRequest) -> RouteDecision:
    """Where one request goes, and whether a shadow copy goes to the candidate."""
    bucket = bucket_of(facts.routing_key or facts.request_id)
    decision = _primary(table, facts, bucket)
    shadow = table.shadow_version
    if (
        shadow
        and shadow != decision.version
        and table.shadow_share > 0.0
        and sample_fraction(facts.request_id) < table.shadow_share
    ):
        decision = RouteDecision(
            decision.version, decision.reason, bucket, decision.rule, shadow, table.epoch
        )
    return decision


def _primary(table: RouteTable, facts: RoutingRequest, bucket: int) -> RouteDecision:
    if facts.pinned_version and facts.pinned_version not in table.versions():
        raise UnknownPinnedVersion(
            f"version {facts.pinned_version[:128]!r} of model {table.model!r} is not served; "
            f"served versions: {', '.join(sorted(table.versions()))}"
        )
    for rule in table.rules:
        if rule.matches(facts.tags):
            return RouteDecision(
                rule.version, RouteReason.RULE, bucket, rule.name, None, table.epoch
            )
    if facts.pinned_version and table.allow_pinning:
        return RouteDecision(
            facts.pinned_version, RouteReason.PINNED, bucket, None, None, table.epoch
        )
    for r in table.routes:
        if any(bucket in rng for rng in r.ranges):
            return RouteDecision(r.version, RouteReason.BUCKET, bucket, None, None, table.epoch)
    return RouteDecision(table.stable_version, RouteReason.BUCKET, bucket, None, None, table.epoch)


def table_problem(table: RouteTable) -> str | None:
    """Why ``table`` cannot be applied (a name no topic can carry), or None."""
    from graylane.topics import TopicNameError, check_model_name, check_version_name

    try:
        check_model_name(table.model)
        for version in sorted(table.versions()):
            check_version_name(version)
    except TopicNameError as exc:
        return str(exc)[:300]
    return None


def default_table(model: str, stable_version: str) -> RouteTable:
    """The table used before the policy engine has published one."""
    return RouteTable(model=model, stable_version=stable_version, epoch=0)


def route_without_table(model: str, stable_version: str, facts: RoutingRequest) -> RouteDecision:
    """The stable version; a pin of any other version is ``UnknownPinnedVersion``."""
    if facts.pinned_version and facts.pinned_version != stable_version:
        raise UnknownPinnedVersion(
            f"version {facts.pinned_version[:128]!r} of model {model!r} is not served; "
            f"served versions: {stable_version}"
        )
    bucket = bucket_of(facts.routing_key or facts.request_id)
    return RouteDecision(stable_version, RouteReason.NO_TABLE, bucket)


class InvalidRouteRule(GraylaneError, ValueError):
    """A rule without a name, tags or version, or with an empty tag key."""

    code = ErrorCode.BAD_REQUEST


class UnknownRouteRule(GraylaneError, LookupError):
    """No rule of that name on the model."""

    code = ErrorCode.NOT_FOUND


def check_rule(rule: RoutingRule) -> None:
    if not rule.name:
        raise InvalidRouteRule("a routing rule needs a name")
    if not rule.version:
        raise InvalidRouteRule(f"rule {rule.name!r} names no version")
    if not rule.match_tags or any(not k for k, _ in rule.match_tags):
        raise InvalidRouteRule(f"rule {rule.name!r} needs at least one tag=value to match")


def check_rules(model: str, rules: Sequence[RoutingRule]) -> None:
    """Raise :class:`InvalidRouteRule` unless every rule is whole and no name repeats."""
    for rule in rules:
        check_rule(rule)
    names = [r.name for r in rules]
    if len(names) != len(set(names)):
        raise InvalidRouteRule(f"rule names repeat on {model}: {names}")


def with_rule(rules: Sequence[RoutingRule], rule: RoutingRule) -> tuple[RoutingRule, ...]:
    """``rules`` with ``rule`` added, or replacing the rule of the same name where it stands."""
    check_rule(rule)
    if any(r.name == rule.name for r in rules):
        return tuple(rule if r.name == rule.name else r for r in rules)
    return (*rules, rule)


def without_rule(rules: Sequence[RoutingRule], name: str, *, model: str) -> tuple[RoutingRule, ...]:
    """``rules`` without the rule ``name`` (:class:`UnknownRouteRule` if ``model`` has none)."""
    if not any(r.name == name for r in rules):
        raise UnknownRouteRule(f"{model} has no routing rule {name!r}")
    return tuple(r for r in rules if r.name != name)


@dataclass(frozen=True)
class VersionWeight:
    version: str
    weight_percent: float


@dataclass(frozen=True, kw_only=True)
class RoutingPlan:
    """The routing of one model as the policy engine wants it: the split (weights, shadow)
    and the cohort routing (tag rules, whether pins are allowed)."""

    model: str
    rollout_id: str
    stable_version: str
    weights: tuple[VersionWeight, ...]
    shadow_version: str | None = None
    shadow_share: float = 0.0
    epoch: int = 0
    rules: tuple[RoutingRule, ...] = ()
    allow_pinning: bool = False

    def __post_init__(self) -> None:
        check_rules(self.model, self.rules)

    def with_rule(self, rule: RoutingRule) -> RoutingPlan:
        """Add ``rule``, or replace the rule of the same name where it stands."""
        return replace(self, rules=with_rule(self.rules, rule))

    def without_rule(self, name: str) -> RoutingPlan:
        return replace(self, rules=without_rule(self.rules, name, model=self.model))

    def with_pinning(self, allow: bool) -> RoutingPlan:
        return replace(self, allow_pinning=allow)

    def with_cohort(self, rules: Sequence[RoutingRule], allow_pinning: bool) -> RoutingPlan:
        """This split with the cohort routing ``rules`` and ``allow_pinning`` instead."""
        return replace(self, rules=tuple(rules), allow_pinning=allow_pinning)

    @property
    def candidate_weight_percent(self) -> float:
        """The weight of a rollout's candidate (the second version of its split), else 0."""
        return self.weights[1].weight_percent if len(self.weights) > 1 else 0.0

    def weight_of(self, version: str) -> float:
        return sum(w.weight_percent for w in self.weights if w.version == version)

    def others(self) -> tuple[tuple[str, float], ...]:
        """Positive weights of the versions other than the stable one (the router's input)."""
        return tuple(
            (w.version, w.weight_percent)
            for w in self.weights
            if w.version != self.stable_version and w.weight_percent > 0.0
        )


def weights_for(
    baseline: str, candidate: str, candidate_percent: float
) -> tuple[VersionWeight, VersionWeight]:
    """``(baseline, 100 - p)`` and ``(candidate, p)``, in that order; zeros are kept."""
    if baseline == candidate:
        raise ValueError(f"baseline and candidate are the same version {baseline!r}")
    if not (math.isfinite(candidate_percent) and 0.0 <= candidate_percent <= 100.0):
        raise ValueError(f"candidate weight {candidate_percent}% is outside 0..100")
    return (
        VersionWeight(baseline, 100.0 - candidate_percent),
        VersionWeight(candidate, candidate_percent),
    )


def split_plan(
    *,
    model: str,
    rollout_id: str,
    stable_version: str,
    baseline: str,
    candidate: str,
    candidate_weight_percent: float,
    shadow_version: str | None = None,
    shadow_share: float = 0.0,
    epoch: int = 0,
) -> RoutingPlan:
    """A rollout's split: ``candidate_weight_percent`` to the candidate, the rest to the
    baseline; a shadow share counts only with a shadow version and the other way round.

    No cohort rules: the policy engine's ``Routing`` gives the plan the model's own."""
    return RoutingPlan(
        model=model,
        rollout_id=rollout_id,
        stable_version=stable_version,
        weights=weights_for(baseline, candidate, candidate_weight_percent),
        shadow_version=shadow_version if shadow_share > 0.0 else None,
        shadow_share=shadow_share if shadow_version else 0.0,
        epoch=epoch,
    )


def stable_plan(model: str, version: str, epoch: int) -> RoutingPlan:
    """Every request to ``version`` (a revert, or cohort rules before any rollout).

    No cohort rules: the policy engine's ``Routing`` gives the plan the model's own."""
    return RoutingPlan(
        model=model,
        rollout_id="",
        stable_version=version,
        weights=(VersionWeight(version, 100.0),),
        epoch=epoch,
    )


def plan_of_table(table: RouteTable) -> RoutingPlan:
    """The plan a published table stands for (after a restart): weights, shadow settings,
    cohort rules and pinning."""
    return RoutingPlan(
        model=table.model,
        rollout_id=table.rollout_id,
        stable_version=table.stable_version,
        weights=tuple(VersionWeight(r.version, r.weight_percent) for r in table.routes),
        shadow_version=table.shadow_version,
        shadow_share=table.shadow_share,
        epoch=table.epoch,
        rules=table.rules,
        allow_pinning=table.allow_pinning,
    )


def route_table_for(plan: RoutingPlan, *, reason: str = "") -> RouteTable:
    """The router's table for ``plan`` (bucket ranges computed by ``graylane.routing``),
    carrying the plan's cohort rules and pinning."""
    return table_for_weights(
        model=plan.model,
        stable_version=plan.stable_version,
        weights=plan.others(),
        rules=plan.rules,
        shadow_version=plan.shadow_version,
        shadow_share=plan.shadow_share,
        epoch=plan.epoch,
        allow_pinning=plan.allow_pinning,
        rollout_id=plan.rollout_id,
        reason=reason,
    )
