"""``graylane acls``: print the ``kafka-acls.sh`` commands of each role's principal."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from collections.abc import Mapping, Sequence

from graylane.acls import AclRule, AclScope, Role, kafka_acls_commands, role_acls
from graylane.kafka.admin import AclApplyError, apply_acls, bindings_for
from graylane.kafka.seam import KafkaFactory
from graylane.settings import Settings
from graylane.topics import TopicLayout

_ROLES = ", ".join(r.value for r in Role)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    acls = sub.add_parser(
        "acls",
        help="print the kafka-acls.sh commands that give each role only the topics it needs",
        description=(
            "Prints one `kafka-acls.sh --add` line per rule for each role given a principal. "
            f"Roles: {_ROLES}. Prefix and bootstrap come from the GRAYLANE_* settings."
        ),
    )
    acls.add_argument(
        "--principal",
        action="append",
        default=[],
        metavar="ROLE=PRINCIPAL",
        help="e.g. router=User:router (repeatable; roles without one are skipped)",
    )
    acls.add_argument(
        "--model", action="append", default=[], metavar="MODEL", help="a served model (repeatable)"
    )
    acls.add_argument(
        "--client",
        action="append",
        default=[],
        metavar="CLIENT_ID",
        help="a producer client id whose reply topic the producer may read (repeatable)",
    )
    acls.add_argument("--bootstrap-server", default="", help="default: GRAYLANE_BOOTSTRAP_SERVERS")
    acls.add_argument(
        "--command-config", default="", help="client properties file for kafka-acls.sh"
    )
    acls.add_argument(
        "--apply",
        action="store_true",
        help=(
            "grant the rules on the broker (CreateAcls through the admin API, as the principal "
            "of the GRAYLANE_SASL_* settings, which must be allowed to alter ACLs) instead of "
            "printing them"
        ),
    )
    acls.set_defaults(handler=_acls)


def parse_principals(items: list[str]) -> dict[Role, str]:
    principals: dict[Role, str] = {}
    for item in items:
        name, sep, principal = item.partition("=")
        try:
            role = Role(name.strip())
        except ValueError:
            raise SystemExit(f"unknown role {name!r} in --principal; roles: {_ROLES}") from None
        if not sep or ":" not in principal:
            raise SystemExit(f"--principal {item!r}: expected ROLE=Type:name, e.g. User:{name}")
        principals[role] = principal
    return principals


def _acls(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    principals = parse_principals(args.principal)
    if not principals:
        raise SystemExit(f"give at least one --principal ROLE=User:NAME (roles: {_ROLES})")
    if not args.model:
        raise SystemExit("give the served models with --model (ingress ACLs are per model)")
    try:
        scope = AclScope(models=tuple(args.model), clients=tuple(args.client))
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    layout = TopicLayout(prefix=settings.topic_prefix)
    bootstrap = args.bootstrap_server or settings.bootstrap_servers
    if args.apply:
        grants = {p: role_acls(layout, role, scope) for role, p in principals.items()}
        if args.bootstrap_server:
            settings = dataclasses.replace(settings, bootstrap_servers=args.bootstrap_server)
        count = asyncio.run(_apply(settings, grants))
        print(f"granted {count} ACL bindings to {len(grants)} principal(s) on {bootstrap}")
        return 0
    for role, principal in principals.items():
        print(f"# {role.value}: {principal}")
        for line in kafka_acls_commands(
            role_acls(layout, role, scope),
            principal,
            bootstrap=bootstrap,
            command_config=args.command_config,
        ):
            print(line)
    return 0


async def _apply(settings: Settings, grants: Mapping[str, Sequence[AclRule]]) -> int:
    admin = KafkaFactory(settings).admin()
    await admin.start()
    try:
        return await apply_acls(admin, bindings_for(grants))
    except AclApplyError as exc:
        raise SystemExit(str(exc)) from None
    finally:
        await admin.close()
