"""Operator commands: ``controlplane``, ``model``, ``rollout``, ``qos``, ``route``, ``audit``,
``traffic``.

Everything but ``controlplane`` (the server itself), ``audit replay|verify`` and
``traffic replay`` (which read Kafka directly, see :mod:`graylane.app.cli.ops_replay`)
talks gRPC to the control plane: ``--addr`` / ``GRAYLANE_CP_ADDR`` (default
``127.0.0.1:50051``), ``--token`` / ``GRAYLANE_CP_TOKEN``, ``--ca`` for TLS.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TypeAlias

from graylane.app.cli import ops_registry, ops_replay, ops_rollouts, ops_routing
from graylane.app.cli.ops_client import call
from graylane.app.cli.ops_time import parse_time
from graylane.app.cli.ops_views import print_decisions
from graylane.app.cli.services import add_observability_args

Sub: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def register(sub: Sub) -> None:
    cp = sub.add_parser("controlplane", help="run the control plane (gRPC API + audit sink)")
    cp.add_argument(
        "--host",
        default="127.0.0.1",
        help="bind address (default loopback; another one needs TLS or --insecure)",
    )
    cp.add_argument("--port", type=int, default=None, help="default 50051 or GRAYLANE_CP_PORT")
    cp.add_argument("--tokens-file", type=Path, help="TOKEN:ROLE[:NAME] per line")
    cp.add_argument("--tls-cert", type=Path, help="server certificate (PEM)")
    cp.add_argument("--tls-key", type=Path, help="server private key (PEM)")
    cp.add_argument(
        "--insecure",
        action="store_true",
        help="allow a plaintext bind beyond loopback (tokens cross the network in clear)",
    )
    cp.add_argument("--max-list-limit", type=int, default=1000, help="rows per list call")
    cp.add_argument("--max-audit-limit", type=int, default=10_000, help="records per audit call")
    cp.add_argument("--max-watch-streams", type=int, default=64, help="concurrent Watch streams")
    add_observability_args(cp)
    cp.set_defaults(handler=_controlplane)

    _model_commands(sub)
    _rollout_commands(sub)
    _qos_commands(sub)
    ops_routing.register(sub, _client)
    audit = sub.add_parser("audit", help="decisions on record: log, replay, verify")
    audit_sub = audit.add_subparsers(dest="audit_command", metavar="ACTION", required=True)
    log = _client(audit_sub.add_parser("log", help="decisions with their reasons (from SQL)"))
    _range(log, required=False)
    log.add_argument("--limit", type=int, default=200)
    log.set_defaults(handler=_audit_log)
    ops_replay.register_audit(audit_sub, _range)
    traffic = sub.add_parser("traffic", help="offline shadow tests from recorded traffic")
    ops_replay.register_traffic(traffic.add_subparsers(dest="traffic_command", required=True))


def _client(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--addr", default=os.environ.get("GRAYLANE_CP_ADDR", "127.0.0.1:50051"))
    parser.add_argument("--token", default=os.environ.get("GRAYLANE_CP_TOKEN", ""))
    parser.add_argument("--ca", type=Path, help="CA certificate: connect with TLS")
    return parser


def _range(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument("--model", required=required)
    parser.add_argument("--rollout", default="", help="a rollout id")
    help_ = "ISO time, unix ms, or ago like 15m / 2h / 1d"
    parser.add_argument("--from", dest="from_", default="", metavar="TIME", help=help_)
    parser.add_argument("--to", default="", metavar="TIME", help=help_)


def _model_commands(sub: Sub) -> None:
    model = sub.add_parser("model", help="the model registry")
    msub = model.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    reg = _client(msub.add_parser("register", help="register a model (and optionally a version)"))
    reg.add_argument("name")
    reg.add_argument("--description", default="")
    reg.add_argument("--version", help="also register this semantic version")
    reg.add_argument("--sha256", default="", help="sha256 of the version's source model")
    reg.add_argument("--stable", action="store_true", help="make --version the stable version")
    reg.set_defaults(handler=ops_registry.model_register)
    _client(msub.add_parser("list", help="registered models")).set_defaults(
        handler=ops_registry.model_list
    )
    stable = _client(msub.add_parser("set-stable", help="make a registered version the stable one"))
    stable.add_argument("name")
    stable.add_argument("--version", required=True, help="a registered semantic version")
    stable.set_defaults(handler=ops_registry.model_set_stable)
    show = _client(msub.add_parser("show", help="versions, variants and their validation"))
    show.add_argument("name")
    show.set_defaults(handler=ops_registry.model_show)


def _rollout_commands(sub: Sub) -> None:
    rollout = sub.add_parser("rollout", help="start and steer gray releases")
    rsub = rollout.add_subparsers(dest="rollout_command", metavar="ACTION", required=True)
    start = _client(rsub.add_parser("start", help="start a rollout of a candidate version"))
    start.add_argument("--model", required=True)
    start.add_argument("--candidate", required=True)
    start.add_argument("--baseline", default="", help="default: the stable version")
    start.add_argument("--strategy", choices=tuple(ops_rollouts.STRATEGIES), default="canary")
    start.add_argument("--steps", default="", help="weights in percent, e.g. 1,5,25,50,100")
    start.add_argument("--min-samples", type=int, default=0, help="per step (0: default)")
    start.add_argument("--dwell-s", type=float, default=0.0, help="per step (0: default)")
    start.add_argument("--max-p99-ratio", type=float, default=0.0)
    start.add_argument("--max-error-delta", type=float, default=0.0)
    start.add_argument("--min-agreement", type=float, default=0.0)
    start.add_argument("--failures-to-rollback", type=int, default=0)
    start.add_argument("--shadow-share", type=float, default=0.0)
    start.add_argument("--shadow-s", type=float, default=0.0)
    start.add_argument("--ab-weight", type=float, default=0.0)
    start.add_argument("--ab-s", type=float, default=0.0)
    start.set_defaults(handler=ops_rollouts.rollout_start)
    status = _client(rsub.add_parser("status", help="the last known state of a rollout"))
    status.add_argument("rollout_id")
    status.set_defaults(handler=ops_rollouts.rollout_status)
    listing = _client(rsub.add_parser("list", help="rollouts, newest first"))
    listing.add_argument("--model", default="")
    listing.add_argument("--active", action="store_true")
    listing.set_defaults(handler=ops_rollouts.rollout_list)
    watch = _client(rsub.add_parser("watch", help="stream state changes until interrupted"))
    watch.add_argument("rollout_id", nargs="?", default="")
    watch.add_argument("--model", default="")
    watch.set_defaults(handler=ops_rollouts.rollout_watch)
    for action in ("pause", "resume", "promote", "rollback", "abort"):
        p = _client(rsub.add_parser(action, help=f"{action} a rollout"))
        p.add_argument("rollout_id")
        p.add_argument("--reason", default="")
        p.set_defaults(handler=ops_rollouts.rollout_action, action=action)
    revert = _client(
        rsub.add_parser(
            "revert",
            help="route 100%% back to the previous stable version (after a promotion "
            "or during a rollout), in one routing update",
        )
    )
    revert.add_argument("--model", required=True)
    revert.add_argument("--reason", default="")
    revert.set_defaults(handler=ops_rollouts.rollout_revert)


def _qos_commands(sub: Sub) -> None:
    qos = sub.add_parser("qos", help="elastic precision policies")
    qsub = qos.add_subparsers(dest="qos_command", metavar="ACTION", required=True)
    qset = _client(qsub.add_parser("set", help="set the QoS policy of a model version"))
    qset.add_argument("--model", required=True)
    qset.add_argument("--version", required=True)
    qset.add_argument("--slo-ms", type=float, required=True, help="p99 latency objective")
    qset.add_argument("--ladder", required=True, help="variants, quality first: fp32,fp16,int8")
    qset.add_argument("--floor", default="", help="lowest variant allowed")
    qset.add_argument("--sustain-s", type=float, default=0.0)
    qset.add_argument("--min-dwell-s", type=float, default=0.0)
    qset.add_argument("--max-queue-wait-ms", type=float, default=0.0)
    qset.add_argument(
        "--capacity",
        action="append",
        default=[],
        metavar="VARIANT=RPS",
        help="one worker's capacity of a rung (default: this host's `graylane calibrate`)",
    )
    qset.add_argument(
        "--up-capacity-fraction",
        type=float,
        default=0.0,
        help="step up once the load is below this share of the rung above's capacity (0.7)",
    )
    qset.add_argument("--disabled", action="store_true", help="store the policy but do not act")
    qset.set_defaults(handler=ops_rollouts.qos_set)
    qstatus = _client(qsub.add_parser("status", help="the policy and the active variant"))
    qstatus.add_argument("--model", required=True)
    qstatus.add_argument("--version", required=True)
    qstatus.set_defaults(handler=ops_rollouts.qos_status)


# -- handlers kept here: the server itself and the audit log ----------------------


def _controlplane(args: argparse.Namespace) -> int:
    from graylane.app.cli.services import run_service, setup_service_logging
    from graylane.kafka.seam import KafkaFactory
    from graylane.services.controlplane.auth import AuthError
    from graylane.services.controlplane.limits import ApiLimits, UnsafeConfig
    from graylane.services.controlplane.server import ControlPlaneServer, ServerConfig
    from graylane.settings import Settings

    try:
        config = ServerConfig.from_env(
            tokens_file=args.tokens_file,
            host=args.host,
            port=args.port,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            insecure=args.insecure,
            metrics_port=args.metrics_port,
            limits=ApiLimits(
                max_list_limit=args.max_list_limit,
                max_audit_limit=args.max_audit_limit,
                max_watch_streams=args.max_watch_streams,
            ),
        )
        settings = Settings.from_env()
        setup_service_logging("controlplane", settings, args)
        server = ControlPlaneServer(config, KafkaFactory(settings))
    except (AuthError, UnsafeConfig, ValueError) as exc:
        raise SystemExit(f"graylane controlplane: {exc}") from None
    return run_service(server.serve)


def _audit_log(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    query = pb.AuditQuery(
        model=args.model or "",
        rollout_id=args.rollout,
        from_unix_ms=parse_time(args.from_),
        to_unix_ms=parse_time(args.to),
        limit=args.limit,
    )
    res = call(args, "Audit", "Query", query)
    print_decisions(res.records, title="decisions")
    return 0
