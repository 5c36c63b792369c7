"""Operator commands: ``controlplane``, ``model``, ``rollout``, ``qos``, ``audit``, ``traffic``.

Everything but ``controlplane`` (the server itself), ``audit replay|verify`` and
``traffic replay`` (which read Kafka directly, see :mod:`graylane.app.cli.ops_replay`)
talks gRPC to the control plane: ``--addr`` / ``GRAYLANE_CP_ADDR`` (default
``127.0.0.1:50051``), ``--token`` / ``GRAYLANE_CP_TOKEN``, ``--ca`` for TLS.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeAlias

from graylane.app.cli import ops_replay
from graylane.app.cli.ops_time import parse_time

_PHASES = {
    0: "unspecified",
    1: "pending",
    2: "shadowing",
    3: "progressing",
    4: "ab_holding",
    5: "paused",
    6: "promoted",
    7: "rolled_back",
    8: "aborted",
}
_STRATEGIES = ("canary", "shadow", "ab")
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
    cp.set_defaults(handler=_controlplane)

    _model_commands(sub)
    _rollout_commands(sub)
    _qos_commands(sub)
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
    reg.set_defaults(handler=_model_register)
    _client(msub.add_parser("list", help="registered models")).set_defaults(handler=_model_list)
    show = _client(msub.add_parser("show", help="versions, variants and their validation"))
    show.add_argument("name")
    show.set_defaults(handler=_model_show)


def _rollout_commands(sub: Sub) -> None:
    rollout = sub.add_parser("rollout", help="start and steer gray releases")
    rsub = rollout.add_subparsers(dest="rollout_command", metavar="ACTION", required=True)
    start = _client(rsub.add_parser("start", help="start a rollout of a candidate version"))
    start.add_argument("--model", required=True)
    start.add_argument("--candidate", required=True)
    start.add_argument("--baseline", default="", help="default: the stable version")
    start.add_argument("--strategy", choices=_STRATEGIES, default="canary")
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
    start.set_defaults(handler=_rollout_start)
    status = _client(rsub.add_parser("status", help="the last known state of a rollout"))
    status.add_argument("rollout_id")
    status.set_defaults(handler=_rollout_status)
    listing = _client(rsub.add_parser("list", help="rollouts, newest first"))
    listing.add_argument("--model", default="")
    listing.add_argument("--active", action="store_true")
    listing.set_defaults(handler=_rollout_list)
    watch = _client(rsub.add_parser("watch", help="stream state changes until interrupted"))
    watch.add_argument("rollout_id", nargs="?", default="")
    watch.add_argument("--model", default="")
    watch.set_defaults(handler=_rollout_watch)
    for action in ("pause", "resume", "promote", "rollback", "abort"):
        p = _client(rsub.add_parser(action, help=f"{action} a rollout"))
        p.add_argument("rollout_id")
        p.add_argument("--reason", default="")
        p.set_defaults(handler=_rollout_action, action=action)


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
    qset.add_argument("--disabled", action="store_true", help="store the policy but do not act")
    qset.set_defaults(handler=_qos_set)
    qstatus = _client(qsub.add_parser("status", help="the policy and the active variant"))
    qstatus.add_argument("--model", required=True)
    qstatus.add_argument("--version", required=True)
    qstatus.set_defaults(handler=_qos_status)


# -- plumbing ---------------------------------------------------------------------------


def _stubs(args: argparse.Namespace) -> tuple[Any, Any]:
    import grpc

    from graylane.v1 import controlplane_pb2_grpc as rpc

    if args.ca is not None:
        channel = grpc.secure_channel(
            args.addr, grpc.ssl_channel_credentials(root_certificates=args.ca.read_bytes())
        )
    else:
        channel = grpc.insecure_channel(args.addr)
    metadata = (("authorization", f"Bearer {args.token}"),) if args.token else ()
    return rpc, (channel, metadata)


def _call(args: argparse.Namespace, stub_name: str, method: str, request: Any) -> Any:
    import grpc

    rpc, (channel, metadata) = _stubs(args)
    stub = getattr(rpc, f"{stub_name}Stub")(channel)
    try:
        return getattr(stub, method)(request, metadata=metadata, timeout=30)
    except grpc.RpcError as exc:
        raise SystemExit(f"{method}: {exc.code().name}: {exc.details()}") from None
    finally:
        channel.close()


def _console() -> Any:
    from rich.console import Console

    return Console()


def _table(title: str, columns: Iterable[str], rows: Iterable[Iterable[object]]) -> None:
    from rich.table import Table

    table = Table(title=title)
    for i, c in enumerate(columns):
        # The first column holds ids and times people copy: never wrap it.
        table.add_column(c, no_wrap=i == 0)
    for row in rows:
        table.add_row(*(str(x) for x in row))
    _console().print(table)


def when(ms: int) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _state_rows(state: Any) -> list[tuple[str, object]]:
    spec = state.spec
    return [
        ("rollout", state.rollout_id),
        ("model", state.model),
        ("baseline -> candidate", f"{spec.baseline_version} -> {spec.candidate_version}"),
        ("phase", _PHASES.get(state.phase, state.phase)),
        ("step", f"{state.step_index + 1} of {len(spec.steps)}"),
        ("candidate weight", f"{state.candidate_weight_percent:g}%"),
        ("consecutive failures", state.consecutive_failures),
        ("last reason", state.last_reason or "-"),
        ("updated", when(state.updated_at_unix_ms)),
        ("created", f"{when(spec.created_at_unix_ms)} by {spec.created_by or '-'}"),
    ]


def _print_state(state: Any) -> None:
    _table("rollout", ("field", "value"), _state_rows(state))


# -- handlers ------------------------------------------------------------------------------


def _controlplane(args: argparse.Namespace) -> int:
    from graylane.app.cli.services import run_service
    from graylane.kafka.factory import KafkaFactory
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
            limits=ApiLimits(
                max_list_limit=args.max_list_limit,
                max_audit_limit=args.max_audit_limit,
                max_watch_streams=args.max_watch_streams,
            ),
        )
        server = ControlPlaneServer(config, KafkaFactory(Settings.from_env()))
    except (AuthError, UnsafeConfig, ValueError) as exc:
        raise SystemExit(f"graylane controlplane: {exc}") from None
    return run_service(server.serve)


def _model_register(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    m = _call(
        args,
        "ModelRegistry",
        "RegisterModel",
        pb.RegisterModelRequest(name=args.name, description=args.description),
    )
    print(f"model {m.name} registered")
    if args.version:
        v = _call(
            args,
            "ModelRegistry",
            "RegisterVersion",
            pb.RegisterVersionRequest(
                model=args.name, version=args.version, source_sha256=args.sha256
            ),
        )
        print(f"version {v.version} registered")
    if args.stable:
        if not args.version:
            raise SystemExit("--stable needs --version")
        _call(
            args,
            "ModelRegistry",
            "SetStable",
            pb.SetStableRequest(model=args.name, version=args.version),
        )
        print(f"{args.version} is now the stable version of {args.name}")
    return 0


def _model_list(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    res = _call(args, "ModelRegistry", "ListModels", pb.ListModelsRequest())
    _table(
        "models",
        ("model", "stable", "description", "created"),
        [
            (m.name, m.stable_version or "-", m.description, when(m.created_at_unix_ms))
            for m in res.models
        ],
    )
    return 0


def _model_show(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    res = _call(args, "ModelRegistry", "ListVersions", pb.ListVersionsRequest(model=args.name))
    rows = []
    for v in res.versions:
        variants = v.variants or [None]
        for a in variants:
            if a is None:
                rows.append((v.version, "*" if v.stable else "", v.status, "-", "-", "-"))
                continue
            val = a.validation
            check = (
                ("passed" if val.passed else "FAILED: " + "; ".join(val.failures))
                if val.validated
                else "not validated"
            )
            rows.append(
                (
                    v.version,
                    "*" if v.stable else "",
                    v.status,
                    a.artifact,
                    "yes" if a.servable else "no",
                    check,
                )
            )
    _table(
        f"{res.model.name} (stable {res.model.stable_version or '-'})",
        ("version", "stable", "status", "variant", "servable", "validation"),
        rows,
    )
    return 0


def _steps(args: argparse.Namespace) -> list[Any]:
    from graylane.v1 import rollout_pb2

    if not args.steps:
        if args.min_samples or args.dwell_s:
            raise SystemExit("--min-samples / --dwell-s need --steps")
        return []
    try:
        weights = [float(w) for w in args.steps.split(",") if w.strip()]
    except ValueError:
        raise SystemExit(f"--steps {args.steps!r}: expected numbers like 1,5,25,50,100") from None
    return [
        rollout_pb2.RolloutStep(
            weight_percent=w, min_samples=args.min_samples or 100, min_dwell_s=args.dwell_s or 60.0
        )
        for w in weights
    ]


def _rollout_start(args: argparse.Namespace) -> int:
    from graylane.v1 import rollout_pb2

    spec = rollout_pb2.RolloutSpec(
        model=args.model,
        baseline_version=args.baseline,
        candidate_version=args.candidate,
        strategy={
            "canary": rollout_pb2.CANARY,
            "shadow": rollout_pb2.SHADOW_THEN_CANARY,
            "ab": rollout_pb2.AB_SPLIT,
        }[args.strategy],
        steps=_steps(args),
        gates=rollout_pb2.GateSpec(
            max_p99_ratio=args.max_p99_ratio,
            max_error_rate_delta=args.max_error_delta,
            min_output_agreement=args.min_agreement,
        ),
        failures_to_rollback=args.failures_to_rollback,
        shadow_share=args.shadow_share,
        shadow_duration_s=args.shadow_s,
        ab_weight_percent=args.ab_weight,
        ab_duration_s=args.ab_s,
    )
    _print_state(_call(args, "Rollouts", "Start", spec))
    return 0


def _rollout_status(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    _print_state(_call(args, "Rollouts", "Get", pb.GetRolloutRequest(rollout_id=args.rollout_id)))
    return 0


def _rollout_list(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    res = _call(
        args, "Rollouts", "List", pb.ListRolloutsRequest(model=args.model, active_only=args.active)
    )
    _table(
        "rollouts",
        ("rollout", "model", "versions", "phase", "weight", "updated", "reason"),
        [
            (
                s.rollout_id,
                s.model,
                f"{s.spec.baseline_version} -> {s.spec.candidate_version}",
                _PHASES.get(s.phase, s.phase),
                f"{s.candidate_weight_percent:g}%",
                when(s.updated_at_unix_ms),
                s.last_reason,
            )
            for s in res.rollouts
        ],
    )
    return 0


def _rollout_watch(args: argparse.Namespace) -> int:
    import grpc

    from graylane.v1 import controlplane_pb2 as pb

    rpc, (channel, metadata) = _stubs(args)
    stream = rpc.RolloutsStub(channel).Watch(
        pb.WatchRolloutsRequest(model=args.model, rollout_id=args.rollout_id, initial=True),
        metadata=metadata,
    )
    try:
        for s in stream:
            print(
                f"{when(s.updated_at_unix_ms)} {s.rollout_id} {_PHASES.get(s.phase, s.phase)} "
                f"step={s.step_index + 1} weight={s.candidate_weight_percent:g}% "
                f"failures={s.consecutive_failures} {s.last_reason}",
                flush=True,
            )
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.CANCELLED:
            raise SystemExit(f"Watch: {exc.code().name}: {exc.details()}") from None
    finally:
        channel.close()
    return 0


def _rollout_action(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    receipt = _call(
        args,
        "Rollouts",
        args.action.capitalize(),
        pb.RolloutActionRequest(rollout_id=args.rollout_id, reason=args.reason),
    )
    print(
        f"{args.action} of {receipt.rollout_id} sent (command {receipt.command_id}); "
        f"last known phase {_PHASES.get(receipt.state.phase, receipt.state.phase)}"
    )
    return 0


def _qos_set(args: argparse.Namespace) -> int:
    from graylane.v1 import rollout_pb2

    policy = rollout_pb2.QosPolicy(
        model=args.model,
        version=args.version,
        slo_p99_ms=args.slo_ms,
        ladder=[x.strip() for x in args.ladder.split(",") if x.strip()],
        quality_floor=args.floor,
        sustain_s=args.sustain_s,
        min_dwell_s=args.min_dwell_s,
        max_queue_wait_ms=args.max_queue_wait_ms,
        enabled=not args.disabled,
    )
    _print_policy(_call(args, "Qos", "SetPolicy", policy))
    return 0


def _qos_status(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    _print_policy(
        _call(
            args, "Qos", "GetPolicy", pb.GetQosPolicyRequest(model=args.model, version=args.version)
        )
    )
    return 0


def _print_policy(view: Any) -> None:
    p = view.policy
    rows: list[tuple[str, object]] = [
        ("model / version", f"{p.model} {p.version}"),
        ("enabled", p.enabled),
        ("SLO p99", f"{p.slo_p99_ms:g} ms"),
        ("ladder", " > ".join(p.ladder)),
        ("quality floor", p.quality_floor or p.ladder[-1] if p.ladder else "-"),
        ("step down above", f"SLO x {1 + p.step_down_margin:g} for {p.sustain_s:g}s"),
        ("step up below", f"SLO x {p.step_up_ratio:g} for {p.sustain_s:g}s"),
        ("min dwell", f"{p.min_dwell_s:g}s"),
        ("active variant", view.active_variant or "unknown (no precision change on record)"),
        ("active since", when(view.active_since_unix_ms)),
        ("last reason", view.last_reason or "-"),
        ("updated", f"{when(view.updated_at_unix_ms)} by {view.updated_by or '-'}"),
    ]
    _table("QoS policy", ("field", "value"), rows)


def _audit_log(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    query = pb.AuditQuery(
        model=args.model or "",
        rollout_id=args.rollout,
        from_unix_ms=parse_time(args.from_),
        to_unix_ms=parse_time(args.to),
        limit=args.limit,
    )
    res = _call(args, "Audit", "Query", query)
    print_decisions(res.records, title="decisions")
    return 0


def print_decisions(
    records: Iterable[Any], *, title: str, extra: Callable[[Any], str] | None = None
) -> None:
    from graylane.v1 import audit_pb2

    rows = []
    for r in records:
        after = r.rollout_after if r.HasField("rollout_after") else None
        weight = f"{after.candidate_weight_percent:g}%" if after is not None else "-"
        variant = r.qos_after.active_variant if r.HasField("qos_after") else ""
        numbers = " ".join(
            f"{s.version}/{s.variant}: n={s.requests} err={s.errors} p99={s.p99_ms:.1f}ms"
            for s in r.inputs
        )
        if extra is not None:
            numbers = " ".join(x for x in (numbers, extra(r)) if x)
        rows.append(
            (
                when(r.decided_at_unix_ms),
                r.rollout_id or r.version,
                audit_pb2.DecisionKind.Name(r.kind).removeprefix("DECISION_").lower(),
                r.rule,
                r.reason,
                variant or weight,
                numbers or "-",
            )
        )
    _table(
        title,
        ("when", "rollout/version", "decision", "rule", "reason", "weight/variant", "key numbers"),
        rows,
    )
    if not rows:
        print("no decisions in that range", file=sys.stderr)
