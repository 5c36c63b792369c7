"""``graylane audit``: decisions on record (``log`` from the control plane's SQL;
``replay`` and ``verify`` straight from Kafka, :mod:`graylane.app.cli.replay`), and
``graylane traffic replay``, the offline shadow over recorded requests.
"""

from __future__ import annotations

import argparse

from graylane.app.cli import replay
from graylane.app.cli.controlplane_calls import Sub, call, client_args
from graylane.app.cli.views import add_output, emit_list, parse_time, print_decisions

__all__ = ["register"]


def register(sub: Sub) -> None:
    """``audit log|replay|verify`` and ``traffic replay``."""
    audit = sub.add_parser("audit", help="decisions on record: log, replay, verify")
    audit_sub = audit.add_subparsers(dest="audit_command", metavar="ACTION", required=True)
    log = add_output(
        client_args(audit_sub.add_parser("log", help="decisions with their reasons (from SQL)"))
    )
    _range(log, required=False)
    log.add_argument("--limit", type=int, default=200, help="at most this many decisions")
    log.set_defaults(handler=_audit_log)
    replay.register_audit(audit_sub, _range)
    traffic = sub.add_parser("traffic", help="offline shadow tests from recorded traffic")
    replay.register_traffic(traffic.add_subparsers(dest="traffic_command", required=True))


def _range(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument("--model", required=required, help="decisions about this model")
    parser.add_argument("--rollout", default="", help="a rollout id")
    help_ = "ISO time, unix ms, or ago like 15m / 2h / 1d"
    parser.add_argument("--from", dest="from_", default="", metavar="TIME", help=help_)
    parser.add_argument("--to", default="", metavar="TIME", help=help_)


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
    emit_list(
        args,
        "AuditRecordList",
        res.records,
        lambda r: r.decision_id,
        lambda: print_decisions(res.records, title="decisions"),
    )
    return 0
