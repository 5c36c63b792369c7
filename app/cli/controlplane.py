"""``graylane serve controlplane``: the control plane server (gRPC API, audit sink, verdicts)."""

from __future__ import annotations

import argparse
from pathlib import Path

from graylane.app.cli.controlplane_calls import Sub
from graylane.app.cli.services import add_observability_args

__all__ = ["register_server"]


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
