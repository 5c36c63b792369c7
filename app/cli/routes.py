"""``graylane route``: a model's cohort routing, tag rules to a version and pins."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from graylane.app.cli.controlplane_calls import Sub, call, client_args
from graylane.app.cli.views import add_output, emit, table, when

__all__ = ["parse_match", "register"]


def register(sub: Sub) -> None:
    """``route rule add|list|remove`` and ``route pinning``."""
    _route_commands(sub, client_args)


def _route_commands(
    sub: Any, client: Callable[[argparse.ArgumentParser], argparse.ArgumentParser]
) -> None:
    route = sub.add_parser("route", help="cohort routing: tag rules to a version, pins")
    rsub = route.add_subparsers(dest="route_command", metavar="ACTION", required=True)
    rule = rsub.add_parser("rule", help="tag rules (first match wins, before the weights)")
    rule_sub = rule.add_subparsers(dest="rule_command", metavar="ACTION", required=True)
    add = client(rule_sub.add_parser("add", help="add or replace a rule"))
    add.add_argument("--model", required=True, help="the model")
    add.add_argument("--name", required=True, help="the rule's name (replaces one of that name)")
    add.add_argument(
        "--match",
        required=True,
        action="append",
        metavar="TAG=VALUE",
        help="a request tag the rule matches (repeatable: all must match)",
    )
    add.add_argument("--version", required=True, help="where matching requests go")
    add.set_defaults(handler=rule_add)
    listing = add_output(client(rule_sub.add_parser("list", help="the model's rules and pinning")))
    listing.add_argument("--model", required=True, help="the model")
    listing.set_defaults(handler=rule_list)
    remove = client(rule_sub.add_parser("remove", help="remove a rule by name"))
    remove.add_argument("--model", required=True, help="the model")
    remove.add_argument("--name", required=True, help="the rule's name")
    remove.set_defaults(handler=rule_remove)
    pin = client(rsub.add_parser("pinning", help="allow or refuse explicit version pins"))
    pin.add_argument("--model", required=True, help="the model")
    pin.add_argument("state", choices=("on", "off"), help="on: requests may pin a version")
    pin.set_defaults(handler=pinning)


def parse_match(items: list[str]) -> dict[str, str]:
    """``["tenant=internal", "region=eu"]`` -> tags; refuses items without ``=`` or a key."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"--match {item!r}: expected TAG=VALUE")
        out[key.strip()] = value.strip()
    return out


def rule_add(args: argparse.Namespace) -> int:
    from graylane.v1 import control_pb2
    from graylane.v1 import controlplane_pb2 as pb

    rule = control_pb2.RoutingRule(
        name=args.name, match_tags=parse_match(args.match), version=args.version
    )
    view = call(args, "Routing", "AddRule", pb.AddRouteRuleRequest(model=args.model, rule=rule))
    _print(view)
    return 0


def rule_remove(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    req = pb.RemoveRouteRuleRequest(model=args.model, name=args.name)
    _print(call(args, "Routing", "RemoveRule", req))
    return 0


def rule_list(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    view = call(args, "Routing", "GetConfig", pb.GetRouteConfigRequest(model=args.model))
    emit(args, "RouteConfigView", view, args.model, lambda: _print(view))
    return 0


def pinning(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    req = pb.SetPinningRequest(model=args.model, allow_pinning=args.state == "on")
    _print(call(args, "Routing", "SetPinning", req))
    return 0


def _print(view: Any) -> None:
    c = view.config
    table(
        f"{c.model}: pins {'allowed' if c.allow_pinning else 'refused'}"
        + (
            f", set by {view.updated_by} {when(view.updated_at_unix_ms)}" if view.updated_by else ""
        ),
        ("rule", "match", "version"),
        [
            (r.name, ",".join(f"{k}={v}" for k, v in sorted(r.match_tags.items())), r.version)
            for r in c.rules
        ],
    )
    if view.command_id:
        print(f"sent to the policy engine (command {view.command_id})")
