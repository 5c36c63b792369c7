"""Cohort routing an operator sets per model: tag rules and whether pins are allowed.

A :class:`RouteConfig` travels with every routing table the policy engine
publishes for the model, whatever the rollout does to the weights. Rules are
kept in the order they were added (the first match wins, see
:func:`graylane.routing.table.route`); adding a rule under an existing name
replaces it in place.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from graylane.errors import GraylaneError
from graylane.routing.table import RouteTable, RoutingRule

__all__ = ["InvalidRouteRule", "RouteConfig", "UnknownRouteRule", "config_of_table"]


class InvalidRouteRule(GraylaneError, ValueError):
    """A rule without a name, tags or version, or with an empty tag key."""


class UnknownRouteRule(GraylaneError, LookupError):
    """No rule of that name on the model."""


def check_rule(rule: RoutingRule) -> None:
    if not rule.name:
        raise InvalidRouteRule("a routing rule needs a name")
    if not rule.version:
        raise InvalidRouteRule(f"rule {rule.name!r} names no version")
    if not rule.match_tags or any(not k for k, _ in rule.match_tags):
        raise InvalidRouteRule(f"rule {rule.name!r} needs at least one tag=value to match")


@dataclass(frozen=True, kw_only=True)
class RouteConfig:
    model: str
    rules: tuple[RoutingRule, ...] = ()
    allow_pinning: bool = False

    def __post_init__(self) -> None:
        for rule in self.rules:
            check_rule(rule)
        names = [r.name for r in self.rules]
        if len(names) != len(set(names)):
            raise InvalidRouteRule(f"rule names repeat on {self.model}: {names}")

    def with_rule(self, rule: RoutingRule) -> RouteConfig:
        """Add ``rule``, or replace the rule of the same name where it stands."""
        check_rule(rule)
        if any(r.name == rule.name for r in self.rules):
            rules = tuple(rule if r.name == rule.name else r for r in self.rules)
        else:
            rules = (*self.rules, rule)
        return replace(self, rules=rules)

    def without_rule(self, name: str) -> RouteConfig:
        if not any(r.name == name for r in self.rules):
            raise UnknownRouteRule(f"{self.model} has no routing rule {name!r}")
        return replace(self, rules=tuple(r for r in self.rules if r.name != name))

    def with_pinning(self, allow: bool) -> RouteConfig:
        return replace(self, allow_pinning=allow)


def config_of_table(table: RouteTable) -> RouteConfig:
    """The cohort routing a published table carries."""
    return RouteConfig(model=table.model, rules=table.rules, allow_pinning=table.allow_pinning)
