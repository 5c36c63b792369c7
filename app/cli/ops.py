"""Operator commands: ``model``, ``rollout``, ``qos``, ``route``, ``audit``, ``traffic``
(and the server ``serve controlplane``).

Everything but the server, ``audit replay|verify`` and ``traffic replay`` (which read
Kafka directly, see :mod:`graylane.app.cli.replay`) talks gRPC to the control plane,
wherever the config file's context, the environment or the flags say
(:mod:`graylane.app.cli.contexts`). Read commands take ``-o table|json|yaml|name``
(:mod:`graylane.app.cli.views`). A rollout is named by its id (``ro-...``) or by its
model: the model's active rollout (for ``get`` / ``status``: else its newest).

``rollout status --wait`` exits 0 once the rollout is promoted, 1 once it is rolled
back or aborted, 2 when ``--timeout`` passes first (:data:`WAIT_EXIT_CODES`).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeAlias

from graylane.app.cli import replay
from graylane.app.cli.contexts import (
    ConfigError,
    Connection,
    ConnectionFlags,
    ContextFile,
    config_path,
    environment,
    resolve,
)
from graylane.app.cli.services import add_observability_args
from graylane.app.cli.views import (
    OutputFormat,
    add_output,
    bake_text,
    emit,
    emit_list,
    output_format,
    parse_time,
    phase_name,
    print_decisions,
    print_policy,
    print_state,
    table,
    when,
)
from graylane.rollouts.spec import DriftAction, Strategy
from graylane.rollouts.vocabulary import Phase

__all__ = [
    "STRATEGIES",
    "WAIT_EXIT_CODES",
    "Sub",
    "call",
    "client_args",
    "connection",
    "parse_match",
    "register",
    "register_server",
    "stubs",
    "wait_outcome",
]


Sub: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def register_server(sub: Sub) -> None:
    """``serve controlplane``."""
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
        "--http-port",
        type=int,
        default=None,
        help="serve GET/POST /v1/verdict (a version's gate verdict for Argo Rollouts' web "
        "metric provider and Flagger's webhooks) on this port (default $GRAYLANE_CP_HTTP_PORT,"
        " else off; 0 = a free port)",
    )
    cp.add_argument(
        "--insecure",
        action="store_true",
        help="allow a plaintext bind beyond loopback (tokens cross the network in clear)",
    )
    cp.add_argument("--max-list-limit", type=int, default=1000, help="rows per list call")
    cp.add_argument("--max-audit-limit", type=int, default=10_000, help="records per audit call")
    cp.add_argument("--max-watch-streams", type=int, default=64, help="concurrent Watch streams")
    cp.add_argument(
        "--rollback-window",
        type=int,
        default=10,
        help="how many of a model's last stable revisions `rollout undo --to-revision` reaches",
    )
    add_observability_args(cp)
    cp.set_defaults(handler=_controlplane)


def register(sub: Sub) -> None:
    """The client commands: ``model``, ``rollout``, ``qos``, ``route``, ``audit``, ``traffic``."""
    _model_commands(sub)
    _rollout_commands(sub)
    _qos_commands(sub)
    _route_commands(sub, client_args)
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


class _DeprecatedToken(argparse.Action):
    """``--token``: still read for one release, with a note (it lands in shell history)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print(
            "graylane: --token is deprecated (it ends up in the shell's history); use "
            "--token-file, GRAYLANE_TOKEN or a context's token-file",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, values)


def client_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group(
        "connection", "default: the config file's current context (graylane config --help)"
    )
    group.add_argument(
        "--context", default="", help="a context of the config file (GRAYLANE_CONTEXT)"
    )
    group.add_argument(
        "--addr", default="", help="control plane host:port (GRAYLANE_CP_ADDR; 127.0.0.1:50051)"
    )
    group.add_argument(
        "--token-file",
        type=Path,
        help="file holding the bearer token (GRAYLANE_TOKEN_FILE, or the token in GRAYLANE_TOKEN)",
    )
    group.add_argument(
        "--token", default="", action=_DeprecatedToken, help="deprecated: use --token-file"
    )
    group.add_argument("--ca", type=Path, help="CA certificate (PEM): connect with TLS")
    return parser


def _rollout_ref(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "rollout",
        nargs="?",
        default="",
        metavar="ROLLOUT|MODEL",
        help="a rollout id (ro-..., from `rollout list`) or a model: its active rollout "
        "(get, status: else its newest)",
    )
    parser.add_argument("--model", default="", help="the model whose active rollout to act on")
    return parser


def _range(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument("--model", required=required, help="decisions about this model")
    parser.add_argument("--rollout", default="", help="a rollout id")
    help_ = "ISO time, unix ms, or ago like 15m / 2h / 1d"
    parser.add_argument("--from", dest="from_", default="", metavar="TIME", help=help_)
    parser.add_argument("--to", default="", metavar="TIME", help=help_)


def _model_commands(sub: Sub) -> None:
    model = sub.add_parser("model", help="the model registry")
    msub = model.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    reg = client_args(
        msub.add_parser("register", help="register a model (and optionally a version)")
    )
    reg.add_argument("name", help="the model's name")
    reg.add_argument("--description", default="", help="one line about the model")
    reg.add_argument("--version", help="also register this semantic version")
    reg.add_argument("--sha256", default="", help="sha256 of the version's source model")
    reg.add_argument("--stable", action="store_true", help="make --version the stable version")
    reg.set_defaults(handler=model_register)
    listing = add_output(client_args(msub.add_parser("list", help="registered models")))
    listing.set_defaults(handler=model_list)
    stable = client_args(
        msub.add_parser("set-stable", help="make a registered version the stable one")
    )
    stable.add_argument("name", help="the model's name")
    stable.add_argument("--version", required=True, help="a registered semantic version")
    stable.set_defaults(handler=model_set_stable)
    show = add_output(
        client_args(
            msub.add_parser(
                "show", help="versions, variants (backend, endpoint) and their validation"
            )
        )
    )
    show.add_argument("name", help="the model's name")
    show.set_defaults(handler=model_show)


def _rollout_commands(sub: Sub) -> None:
    rollout = sub.add_parser("rollout", help="start and steer gray releases")
    rsub = rollout.add_subparsers(dest="rollout_command", metavar="ACTION", required=True)
    start = add_output(
        client_args(rsub.add_parser("start", help="start a rollout of a candidate version"))
    )
    start.add_argument("--model", required=True, help="the model to roll out")
    start.add_argument("--candidate", required=True, help="the candidate version")
    start.add_argument("--baseline", default="", help="default: the stable version")
    start.add_argument(
        "--strategy", choices=tuple(STRATEGIES), default="canary", help="how traffic moves"
    )
    start.add_argument("--steps", default="", help="weights in percent, e.g. 1,5,25,50,100")
    start.add_argument("--min-samples", type=int, default=0, help="per step (0: default)")
    start.add_argument("--dwell-s", type=float, default=0.0, help="per step (0: default)")
    start.add_argument(
        "--eval",
        default="",
        metavar="SET",
        help="an evaluation set (JSONL) both versions answer before traffic moves onto "
        "--eval-step; the policy engine reads it at this path",
    )
    start.add_argument(
        "--eval-step",
        type=int,
        default=2,
        help="the step (1-based) the evaluation guards (default 2: before the first move)",
    )
    start.add_argument(
        "--max-drop-vs-stable",
        type=float,
        default=0.02,
        help="how much lower than the baseline's the candidate's mean score may be",
    )
    start.add_argument(
        "--max-p99-ratio", type=float, default=0.0, help="gate: candidate/baseline p99 (0: default)"
    )
    start.add_argument(
        "--max-error-delta",
        type=float,
        default=0.0,
        help="gate: candidate minus baseline error rate (0: default)",
    )
    start.add_argument(
        "--min-agreement",
        type=float,
        default=0.0,
        help="gate: share of shadow outputs agreeing with the baseline (0: default)",
    )
    start.add_argument(
        "--length-drift",
        choices=tuple(a.value for a in DriftAction),
        default=None,
        help="what an output-length / EOS-rate drift of a generation does (default: hold)",
    )
    start.add_argument(
        "--max-length-shift",
        type=float,
        default=None,
        help="tolerated change of the share of answers longer than the baseline's median",
    )
    start.add_argument(
        "--max-eos-delta",
        type=float,
        default=None,
        help="tolerated change of the share of answers the model ended (EOS or a stop)",
    )
    start.add_argument(
        "--failures-to-rollback",
        type=int,
        default=0,
        help="failed gate evaluations in a row that roll back (0: default 2)",
    )
    start.add_argument(
        "--shadow-share", type=float, default=0.0, help="shadow strategy: share of traffic copied"
    )
    start.add_argument("--shadow-s", type=float, default=0.0, help="shadow strategy: seconds")
    start.add_argument("--ab-weight", type=float, default=0.0, help="ab strategy: percent to B")
    start.add_argument("--ab-s", type=float, default=0.0, help="ab strategy: seconds held")
    start.add_argument(
        "--bake-s",
        type=float,
        default=0.0,
        help="seconds the gates keep watching the promoted version (0: no bake period)",
    )
    start.set_defaults(handler=rollout_start)
    get = add_output(client_args(_rollout_ref(rsub.add_parser("get", help="a rollout's state"))))
    get.add_argument(
        "-w", "--watch", action="store_true", help="print it again on every change until ^C"
    )
    get.set_defaults(handler=rollout_get)
    status = add_output(
        client_args(
            _rollout_ref(
                rsub.add_parser(
                    "status",
                    help="a rollout's state; with --wait, exit 0 promoted / 1 rolled back or "
                    "aborted / 2 timeout",
                )
            )
        )
    )
    status.add_argument(
        "--wait", action="store_true", help="wait until the rollout ends; the exit code says how"
    )
    status.add_argument(
        "--timeout", type=float, default=0.0, help="with --wait: give up (exit 2) after S seconds"
    )
    status.add_argument(
        "--interval", type=float, default=1.0, help="with --wait: seconds between two looks"
    )
    status.set_defaults(handler=rollout_status)
    listing = add_output(client_args(rsub.add_parser("list", help="rollouts, newest first")))
    listing.add_argument("--model", default="", help="only this model's rollouts")
    listing.add_argument("--active", action="store_true", help="only rollouts still running")
    listing.set_defaults(handler=rollout_list)
    watch = client_args(rsub.add_parser("watch", help="stream state changes until interrupted"))
    watch.add_argument("rollout_id", nargs="?", default="", help="only this rollout")
    watch.add_argument("--model", default="", help="only this model's rollouts")
    watch.set_defaults(handler=rollout_watch)
    actions = {
        "pause": "hold the candidate at its weight",
        "resume": "continue a paused rollout",
        "promote": "the candidate to 100 % and stable, now",
        "abort": "end the rollout: the candidate to 0 %, the stable version unchanged",
    }
    for action, what in actions.items():
        p = client_args(_rollout_ref(rsub.add_parser(action, help=what)))
        p.add_argument("--reason", default="", help="recorded in the audit log")
        p.set_defaults(handler=rollout_action, action=action)
    rollback = client_args(
        _rollout_ref(rsub.add_parser("rollback", help="deprecated: use abort (or undo)"))
    )
    rollback.add_argument("--reason", default="", help="recorded in the audit log")
    rollback.set_defaults(handler=rollout_action, action="rollback")
    undo = client_args(
        rsub.add_parser(
            "undo",
            help="route 100%% back to the previous stable version (after a promotion "
            "or during a rollout), in one routing update",
        )
    )
    undo.add_argument("target", nargs="?", default="", metavar="MODEL", help="the model")
    undo.add_argument("--model", default="", help="the model (same as MODEL)")
    undo.add_argument("--reason", default="", help="recorded in the audit log")
    undo.add_argument(
        "--to-revision",
        type=int,
        default=0,
        help="go back to this stable revision (see `rollout history`); default: the previous",
    )
    undo.set_defaults(handler=rollout_undo)
    history = add_output(
        client_args(rsub.add_parser("history", help="a model's last stable versions, by revision"))
    )
    history.add_argument("target", metavar="MODEL", help="the model")
    history.set_defaults(handler=rollout_history)
    revert = client_args(rsub.add_parser("revert", help="deprecated: use undo"))
    revert.add_argument("--model", required=True, help="the model")
    revert.add_argument("--reason", default="", help="recorded in the audit log")
    revert.set_defaults(handler=rollout_undo, target="", deprecated="revert")


def _qos_commands(sub: Sub) -> None:
    qos = sub.add_parser("qos", help="elastic precision policies")
    qsub = qos.add_subparsers(dest="qos_command", metavar="ACTION", required=True)
    qset = client_args(qsub.add_parser("set", help="set the QoS policy of a model version"))
    qset.add_argument("--model", required=True, help="the model")
    qset.add_argument("--version", required=True, help="the model version")
    qset.add_argument(
        "--slo-ms", type=float, default=0.0, help="p99 whole-request latency objective"
    )
    qset.add_argument(
        "--slo-ttft-ms", type=float, default=0.0, help="generative: p99 time to first token"
    )
    qset.add_argument(
        "--slo-tpot-ms", type=float, default=0.0, help="generative: p99 time per output token"
    )
    qset.add_argument(
        "--max-waiting",
        type=float,
        default=0.0,
        help="generative: waiting sequences per worker that breach "
        "(default: capacity x TTFT objective, else the Inference Extension's 5)",
    )
    qset.add_argument(
        "--max-kv-cache",
        type=float,
        default=0.0,
        help="generative: KV-cache occupancy that breaches (default 0.8)",
    )
    qset.add_argument("--ladder", required=True, help="variants, quality first: fp32,fp16,int8")
    qset.add_argument("--floor", default="", help="lowest variant allowed")
    qset.add_argument(
        "--sustain-s", type=float, default=0.0, help="p99 must hold this long to step (0: default)"
    )
    qset.add_argument(
        "--min-dwell-s", type=float, default=0.0, help="least time on a rung (0: default)"
    )
    qset.add_argument(
        "--max-queue-wait-ms",
        type=float,
        default=0.0,
        help="step down when queue wait passes this (0: off)",
    )
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
    qset.set_defaults(handler=qos_set)
    qstatus = add_output(
        client_args(qsub.add_parser("status", help="the policy and the active variant"))
    )
    qstatus.add_argument("--model", required=True, help="the model")
    qstatus.add_argument("--version", required=True, help="the model version")
    qstatus.set_defaults(handler=qos_status)


# -- the server itself and the audit log --------------------------------------------


def _controlplane(args: argparse.Namespace) -> int:
    from graylane.app.cli.services import run_service, setup_service_logging
    from graylane.kafka.seam import KafkaFactory
    from graylane.services.controlplane.auth import AuthError
    from graylane.services.controlplane.limits import ApiLimits, UnsafeConfig
    from graylane.services.controlplane.service import ControlPlaneServer, ServerConfig
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
            http_port=args.http_port,
            rollback_window=args.rollback_window,
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
    emit_list(
        args,
        "AuditRecordList",
        res.records,
        lambda r: r.decision_id,
        lambda: print_decisions(res.records, title="decisions"),
    )
    return 0


# -- gRPC plumbing: channel, token metadata, one call ------------------------------------------


def connection(args: argparse.Namespace) -> Connection:
    """Where this command connects: flags, environment, config file context, defaults."""
    env = environment()
    flags = ConnectionFlags(
        address=getattr(args, "addr", "") or "",
        token_file=getattr(args, "token_file", None),
        token=getattr(args, "token", "") or "",
        ca=getattr(args, "ca", None),
        context=getattr(args, "context", "") or "",
    )
    try:
        return resolve(flags, env, ContextFile.load(config_path(env)))
    except ConfigError as exc:
        raise SystemExit(f"graylane: {exc}") from None


def stubs(args: argparse.Namespace) -> tuple[Any, Any]:
    import grpc

    from graylane.v1 import controlplane_pb2_grpc as rpc

    conn = connection(args)
    if conn.ca is not None:
        channel = grpc.secure_channel(
            conn.address, grpc.ssl_channel_credentials(root_certificates=conn.ca.read_bytes())
        )
    else:
        channel = grpc.insecure_channel(conn.address)
    metadata = (("authorization", f"Bearer {conn.token}"),) if conn.token else ()
    return rpc, (channel, metadata)


def call(
    args: argparse.Namespace,
    stub_name: str,
    method: str,
    request: Any,
    *,
    tolerate: tuple[str, ...] = (),
) -> Any:
    """One call; a status code named in ``tolerate`` (e.g. ``ALREADY_EXISTS``) returns None."""
    import grpc

    rpc, (channel, metadata) = stubs(args)
    stub = getattr(rpc, f"{stub_name}Stub")(channel)
    try:
        return getattr(stub, method)(request, metadata=metadata, timeout=30)
    except grpc.RpcError as exc:
        if exc.code().name in tolerate:
            return None
        raise SystemExit(f"{method}: {exc.code().name}: {exc.details()}") from None
    finally:
        channel.close()


# -- ``graylane model``: register models and versions, list them, show variants ----------------


def model_register(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    m = call(
        args,
        "ModelRegistry",
        "RegisterModel",
        pb.RegisterModelRequest(name=args.name, description=args.description),
    )
    print(f"model {m.name} registered")
    if args.stable and not args.version:
        raise SystemExit("--stable needs --version")
    if args.version:
        # A version the builder registered already is fine when it is made stable.
        v = call(
            args,
            "ModelRegistry",
            "RegisterVersion",
            pb.RegisterVersionRequest(
                model=args.name, version=args.version, source_sha256=args.sha256
            ),
            tolerate=("ALREADY_EXISTS",) if args.stable else (),
        )
        print(f"version {args.version} " + ("registered" if v else "was registered already"))
    if args.stable:
        _set_stable(args, args.name, args.version)
    return 0


def model_set_stable(args: argparse.Namespace) -> int:
    _set_stable(args, args.name, args.version)
    return 0


def _set_stable(args: argparse.Namespace, model: str, version: str) -> None:
    from graylane.v1 import controlplane_pb2 as pb

    call(args, "ModelRegistry", "SetStable", pb.SetStableRequest(model=model, version=version))
    print(f"{version} is now the stable version of {model}")


def model_list(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    res = call(args, "ModelRegistry", "ListModels", pb.ListModelsRequest())
    emit_list(
        args,
        "ModelList",
        res.models,
        lambda m: m.name,
        lambda: table(
            "models",
            ("model", "stable", "description", "created"),
            [
                (m.name, m.stable_version or "-", m.description, when(m.created_at_unix_ms))
                for m in res.models
            ],
        ),
    )
    return 0


def model_show(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    res = call(args, "ModelRegistry", "ListVersions", pb.ListVersionsRequest(model=args.name))
    if output_format(args) is not OutputFormat.TABLE:
        emit_list(args, "ModelVersionList", res.versions, lambda v: v.version, lambda: None)
        return 0
    rows: list[tuple[str, ...]] = []
    for v in res.versions:
        version = (v.version, "*" if v.stable else "", v.status)
        if not v.variants:
            rows.append((*version, "-", "-", "-", "-", "-", "-"))
        rows.extend((*version, *_variant_columns(a)) for a in v.variants)
    table(
        f"{res.model.name} (stable {res.model.stable_version or '-'})",
        (
            *("version", "stable", "status", "variant", "backend", "servable", "validation"),
            *("endpoint", "model sha256"),
        ),
        rows,
    )
    return 0


def _variant_columns(a: Any) -> tuple[str, ...]:
    """A ``VariantInfo``'s columns after the version's: variant to model digest."""
    val = a.validation
    check = (
        ("passed" if val.passed else "FAILED: " + "; ".join(val.failures))
        if val.validated
        else "not validated"
    )
    backend = f"{a.backend} {a.backend_version}".strip()
    endpoint, digest = "-", "-"
    if a.HasField("endpoint"):
        endpoint = a.endpoint.url
        digest = a.endpoint.model_sha256[:12] + "…" if a.endpoint.model_sha256 else "unknown"
    return (a.artifact, backend, "yes" if a.servable else "no", check, endpoint, digest)


# -- ``graylane rollout`` and ``graylane qos``: start, watch, steer; set QoS -------------------


STRATEGIES = {
    "canary": Strategy.CANARY,
    "shadow": Strategy.SHADOW_THEN_CANARY,
    "ab": Strategy.AB_SPLIT,
}
"""The ``--strategy`` names of the CLI."""


def steps(args: argparse.Namespace) -> list[Any]:
    from graylane.v1 import rollout_pb2

    if not args.steps:
        if args.min_samples or args.dwell_s or getattr(args, "eval", ""):
            raise SystemExit("--min-samples / --dwell-s / --eval need --steps")
        return []
    try:
        weights = [float(w) for w in args.steps.split(",") if w.strip()]
    except ValueError:
        raise SystemExit(f"--steps {args.steps!r}: expected numbers like 1,5,25,50,100") from None
    out = [
        rollout_pb2.RolloutStep(
            weight_percent=w, min_samples=args.min_samples or 100, min_dwell_s=args.dwell_s or 60.0
        )
        for w in weights
    ]
    if getattr(args, "eval", ""):
        if not 1 <= args.eval_step <= len(out):
            raise SystemExit(f"--eval-step {args.eval_step}: the steps are 1..{len(out)}")
        out[args.eval_step - 1].evaluation.CopyFrom(_step_evaluation(args))
    return out


def _step_evaluation(args: argparse.Namespace) -> Any:
    """The ``--eval`` set as the spec names it: its absolute path and its sha256 now."""
    from graylane.evaluation.sets import EvalSetError, load_set
    from graylane.v1 import rollout_pb2

    path = Path(args.eval).resolve()
    try:
        digest = load_set(path).digest
    except EvalSetError as exc:
        raise SystemExit(f"--eval: {exc}") from None
    return rollout_pb2.StepEvaluation(
        set_path=str(path), max_drop_vs_stable=args.max_drop_vs_stable, set_sha256=digest
    )


def rollout_start(args: argparse.Namespace) -> int:
    from graylane.rollouts.pb import drift_action_to_pb, strategy_to_pb
    from graylane.v1 import rollout_pb2

    spec = rollout_pb2.RolloutSpec(
        model=args.model,
        baseline_version=args.baseline,
        candidate_version=args.candidate,
        strategy=strategy_to_pb(STRATEGIES[args.strategy]),
        steps=steps(args),
        gates=rollout_pb2.GateSpec(
            max_p99_ratio=args.max_p99_ratio,
            max_error_rate_delta=args.max_error_delta,
            min_output_agreement=args.min_agreement,
            length_drift=(
                drift_action_to_pb(DriftAction(args.length_drift))
                if args.length_drift
                else rollout_pb2.DRIFT_ACTION_UNSPECIFIED
            ),
            max_length_shift=args.max_length_shift,
            max_eos_rate_delta=args.max_eos_delta,
        ),
        failures_to_rollback=args.failures_to_rollback,
        shadow_share=args.shadow_share,
        shadow_duration_s=args.shadow_s,
        ab_weight_percent=args.ab_weight,
        ab_duration_s=args.ab_s,
        bake_s=args.bake_s,
    )
    _emit_state(args, call(args, "Rollouts", "Start", spec))
    return 0


def _emit_state(args: argparse.Namespace, state: Any) -> None:
    emit(args, "RolloutState", state, state.rollout_id, lambda: print_state(state))


def rollout_id(args: argparse.Namespace, *, active_only: bool) -> str:
    """The rollout the command names: an id (``ro-...``, or an applied document's name),
    or a model's active rollout (``active_only=False``: else the model's newest one)."""
    from graylane.v1 import controlplane_pb2 as pb

    ref = args.rollout
    if ref and not args.model and not ref.startswith("ro-"):
        # An applied document's name is its rollout's id, whatever it looks like.
        named = call(
            args, "Rollouts", "Get", pb.GetRolloutRequest(rollout_id=ref), tolerate=("NOT_FOUND",)
        )
        if named is not None:
            return str(ref)
    model = args.model or ("" if ref.startswith("ro-") else ref)
    if not model:
        if not ref:
            raise SystemExit("name a rollout: its id (see `graylane rollout list`) or its model")
        return str(ref)
    active = call(args, "Rollouts", "List", pb.ListRolloutsRequest(model=model, active_only=True))
    if active.rollouts:
        return str(active.rollouts[0].rollout_id)
    if not active_only:
        every = call(args, "Rollouts", "List", pb.ListRolloutsRequest(model=model))
        if every.rollouts:
            return str(every.rollouts[0].rollout_id)
    which = "an active rollout" if active_only else "any rollout"
    raise SystemExit(f"model {model!r} has no {which} (see `graylane rollout list`)")


def _get_state(args: argparse.Namespace, rid: str) -> Any:
    from graylane.v1 import controlplane_pb2 as pb

    return call(args, "Rollouts", "Get", pb.GetRolloutRequest(rollout_id=rid))


def rollout_get(args: argparse.Namespace) -> int:
    rid = rollout_id(args, active_only=False)
    if not args.watch:
        _emit_state(args, _get_state(args, rid))
        return 0
    return _watch(args, rid, lambda s: _emit_state(args, s))


WAIT_EXIT_CODES: dict[Phase, int] = {
    Phase.PROMOTED: 0,
    Phase.ROLLED_BACK: 1,
    Phase.ABORTED: 1,
}
"""``rollout status --wait``: the exit code of each end; 2 when the timeout passes first."""
WAIT_TIMEOUT_EXIT = 2


def wait_outcome(phase_value: int) -> int | None:
    """The exit code once a rollout is in ``phase_value`` (a ``RolloutPhase``); ``None``
    while it still runs."""
    from graylane.rollouts.pb import phase_from_pb

    phase = phase_from_pb(phase_value)
    return WAIT_EXIT_CODES.get(phase) if phase is not None else None


def rollout_status(args: argparse.Namespace) -> int:
    rid = rollout_id(args, active_only=False)
    state = _get_state(args, rid)
    if not args.wait:
        _emit_state(args, state)
        return 0
    deadline = time.monotonic() + args.timeout if args.timeout > 0 else None
    seen = ""
    while True:
        baking = phase_name(state.phase) == "baking"
        bake = f"({bake_text(state)}) " if baking else ""
        line = (
            f"{rid} {phase_name(state.phase)} {bake}weight={state.candidate_weight_percent:g}% "
            f"{state.last_reason}"
        )
        if line != seen:
            print(line, file=sys.stderr, flush=True)
            seen = line
        outcome = wait_outcome(state.phase)
        if outcome is not None:
            _emit_state(args, state)
            return outcome
        if deadline is not None and time.monotonic() >= deadline:
            print(
                f"{rid}: still {phase_name(state.phase)} after {args.timeout:g}s", file=sys.stderr
            )
            _emit_state(args, state)
            return WAIT_TIMEOUT_EXIT
        pause = (
            args.interval if deadline is None else min(args.interval, deadline - time.monotonic())
        )
        time.sleep(max(pause, 0.0))
        state = _get_state(args, rid)


def rollout_list(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    res = call(
        args, "Rollouts", "List", pb.ListRolloutsRequest(model=args.model, active_only=args.active)
    )
    emit_list(
        args, "RolloutList", res.rollouts, lambda s: s.rollout_id, lambda: _rollout_table(res)
    )
    return 0


def _rollout_table(res: Any) -> None:
    table(
        "rollouts",
        ("rollout", "model", "versions", "phase", "weight", "updated", "reason"),
        [
            (
                s.rollout_id,
                s.model,
                f"{s.spec.baseline_version} -> {s.spec.candidate_version}",
                phase_name(s.phase),
                f"{s.candidate_weight_percent:g}%",
                when(s.updated_at_unix_ms),
                s.last_reason,
            )
            for s in res.rollouts
        ],
    )


def rollout_watch(args: argparse.Namespace) -> int:
    def line(s: Any) -> None:
        print(
            f"{when(s.updated_at_unix_ms)} {s.rollout_id} {phase_name(s.phase)} "
            f"step={s.step_index + 1} weight={s.candidate_weight_percent:g}% "
            f"failures={s.consecutive_failures} {s.last_reason}",
            flush=True,
        )

    return _watch(args, args.rollout_id, line, model=args.model)


def _watch(
    args: argparse.Namespace, rid: str, show: Callable[[Any], None], *, model: str = ""
) -> int:
    """Show every state change of ``rid`` (or of ``model``'s rollouts) until interrupted."""
    import grpc

    from graylane.v1 import controlplane_pb2 as pb

    rpc, (channel, metadata) = stubs(args)
    stream = rpc.RolloutsStub(channel).Watch(
        pb.WatchRolloutsRequest(model=model, rollout_id=rid, initial=True),
        metadata=metadata,
    )
    try:
        for s in stream:
            show(s)
            sys.stdout.flush()
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.CANCELLED:
            raise SystemExit(f"Watch: {exc.code().name}: {exc.details()}") from None
    finally:
        channel.close()
    return 0


def rollout_action(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    if args.action == "rollback":
        print(
            "graylane: `rollout rollback` is deprecated: use `rollout abort` (end the rollout, "
            "candidate to 0 %) or `rollout undo` (back to the previous stable version)",
            file=sys.stderr,
        )
    rid = rollout_id(args, active_only=True)
    receipt = call(
        args,
        "Rollouts",
        args.action.capitalize(),
        pb.RolloutActionRequest(rollout_id=rid, reason=args.reason),
    )
    print(
        f"{args.action} of {receipt.rollout_id} sent (command {receipt.command_id}); "
        f"last known phase {phase_name(receipt.state.phase)}"
    )
    return 0


def rollout_undo(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    if getattr(args, "deprecated", ""):
        print("graylane: `rollout revert` is deprecated: use `rollout undo MODEL`", file=sys.stderr)
    model = args.model or args.target
    if not model:
        raise SystemExit("name the model: graylane rollout undo MODEL")
    ask = pb.RevertRequest(
        model=model, reason=args.reason, to_revision=getattr(args, "to_revision", 0)
    )
    receipt = call(args, "Rollouts", "Revert", ask)
    how = f" (rolls back {receipt.rollout_id})" if receipt.rollout_id else ""
    print(
        f"revert of {receipt.model} to {receipt.target_version}{how} sent "
        f"(command {receipt.command_id})"
    )
    return 0


def rollout_history(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    res = call(args, "Rollouts", "History", pb.StableHistoryRequest(model=args.target))
    emit_list(
        args,
        "StableHistory",
        res.revisions,
        lambda r: str(r.revision),
        lambda: table(
            f"stable revisions of {args.target}",
            ["REVISION", "VERSION", "SINCE", ""],
            [
                (str(r.revision), r.version, when(r.set_at_unix_ms), "current" if r.current else "")
                for r in res.revisions
            ],
        ),
    )
    return 0


def _rung_capacities(args: argparse.Namespace, ladder: list[str]) -> dict[str, float]:
    """``--capacity`` as given, else this host's calibration of the version (if any)."""
    from graylane.capacity import load_profile, rung_capacities, this_host
    from graylane.settings import Settings

    if args.capacity:
        given: dict[str, float] = {}
        for item in args.capacity:
            name, _, rps = item.partition("=")
            try:
                given[name.strip()] = float(rps)
            except ValueError:
                raise SystemExit(f"--capacity {item!r}: expected VARIANT=RPS") from None
        return given
    profile = load_profile(Settings.from_env().artifact_dir, args.model, args.version)
    if profile is None or profile.host != this_host():
        return {}
    return dict(rung_capacities(profile, ladder))


def qos_set(args: argparse.Namespace) -> int:
    from graylane.v1 import rollout_pb2

    ladder = [x.strip() for x in args.ladder.split(",") if x.strip()]
    if max(args.slo_ms, args.slo_ttft_ms, args.slo_tpot_ms) <= 0.0:
        raise SystemExit("state an objective: --slo-ms, --slo-ttft-ms and/or --slo-tpot-ms")
    policy = rollout_pb2.QosPolicy(
        model=args.model,
        version=args.version,
        slo_p99_ms=args.slo_ms,
        slo_ttft_p99_ms=args.slo_ttft_ms,
        slo_tpot_p99_ms=args.slo_tpot_ms,
        max_waiting_sequences=args.max_waiting,
        max_kv_cache_occupancy=args.max_kv_cache,
        ladder=ladder,
        quality_floor=args.floor,
        sustain_s=args.sustain_s,
        min_dwell_s=args.min_dwell_s,
        max_queue_wait_ms=args.max_queue_wait_ms,
        enabled=not args.disabled,
        rung_capacity_rps=_rung_capacities(args, ladder),
        up_capacity_fraction=args.up_capacity_fraction,
    )
    print_policy(call(args, "Qos", "SetPolicy", policy))
    return 0


def qos_status(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    view = call(
        args, "Qos", "GetPolicy", pb.GetQosPolicyRequest(model=args.model, version=args.version)
    )
    emit(args, "QosPolicyView", view, f"{args.model}/{args.version}", lambda: print_policy(view))
    return 0


# -- ``graylane route``: a model's cohort routing ----------------------------------------------


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
