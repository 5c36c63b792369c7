"""``graylane serve policy``: the policy engine (faust-streaming worker)."""

from __future__ import annotations

import argparse
import sys

from graylane.app.cli.services import add_observability_args


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    policy = sub.add_parser(
        "policy", help="run the policy engine: rollout and QoS decisions from telemetry"
    )
    policy.add_argument("--window-ms", type=int, default=10_000, help="sliding window length")
    policy.add_argument("--step-ms", type=int, default=2_000, help="window step = decision tick")
    policy.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="MODEL",
        help="a model whose shadow results to read for output agreement (repeatable)",
    )
    policy.add_argument(
        "--lease-ttl-ms",
        type=int,
        default=6_000,
        help="single writer: a standby takes over this long after the active one stops renewing",
    )
    policy.add_argument(
        "--no-lease", action="store_true", help="run without the single-writer lease"
    )
    policy.add_argument(
        "--sharded",
        action="store_true",
        help="share the models between several instances by partition (one consumer group; "
        "telemetry, commands and outcomes co-partitioned, keyed by model); implies --no-lease",
    )
    policy.add_argument(
        "--max-replicas",
        type=int,
        default=1,
        help="scale out a version up to this many workers (1 = never; also bounded by the "
        "version topic's partitions); published on <p>.control.scale",
    )
    policy.add_argument("--min-replicas", type=int, default=1, help="never scale in below this")
    policy.add_argument(
        "--scale-cooldown-s",
        type=float,
        default=30.0,
        help="scale in after this long at low load (and this long after the last change)",
    )
    policy.add_argument(
        "--scale-lag-growth-s",
        type=float,
        default=10.0,
        help="scale out when a version's consumer lag kept growing this long",
    )
    policy.add_argument(
        "--scale-dwell-s",
        type=float,
        default=15.0,
        help="at least this long between two scale-outs (a new worker warms up)",
    )
    policy.add_argument(
        "--scale-in-load",
        type=float,
        default=0.5,
        help="scale in when throughput stays under this share of one replica fewer's capacity",
    )
    policy.add_argument(
        "--scale-settle-s",
        type=float,
        default=10.0,
        help="QoS steps up only once every replica asked for serves and this long after a change",
    )
    policy.add_argument(
        "--prometheus-url",
        default=None,
        help="Prometheus base URL for rollouts' metric gates (PromQL); default "
        "$GRAYLANE_PROMETHEUS_URL, else metric gates read inconclusive",
    )
    policy.add_argument(
        "--loglevel", default="info", choices=("debug", "info", "warning"), help="faust's log level"
    )
    add_observability_args(policy)
    policy.set_defaults(handler=_policy)


def _policy(args: argparse.Namespace) -> int:
    import asyncio
    import os

    import faust

    from graylane.app.cli.services import setup_service_logging
    from graylane.kafka.membership import claim_instance
    from graylane.kafka.seam import KafkaFactory
    from graylane.policy_engine.lease import LeaseKeeper
    from graylane.policy_engine.logic.scale import ScalePolicy
    from graylane.policy_engine.service import (
        PolicyConfig,
        UnshardableTopics,
        create_app,
        prepare_topics,
    )
    from graylane.rollouts.errors import InvalidPolicy
    from graylane.settings import Settings

    try:
        scale = ScalePolicy(
            min_replicas=args.min_replicas,
            max_replicas=args.max_replicas,
            cooldown_s=args.scale_cooldown_s,
            lag_growth_s=args.scale_lag_growth_s,
            out_dwell_s=args.scale_dwell_s,
            in_load_fraction=args.scale_in_load,
            settle_s=args.scale_settle_s,
        )
    except InvalidPolicy as exc:
        raise SystemExit(str(exc)) from None
    settings = Settings.from_env()
    handler = setup_service_logging("policy-engine", settings, args)
    # One id per live process, the same after a restart in place: it holds the lease
    # on (no wait for its expiry) and rejoins the group as the same static member.
    instance = claim_instance(
        "policy", f"{settings.topic_prefix}-policy", explicit=settings.instance_id
    )
    lease = None
    if not (args.no_lease or args.sharded):
        # Passive until this instance holds the lease; only then does it join the group.
        lease = LeaseKeeper(
            KafkaFactory(settings),
            instance.instance_id,
            ttl_ms=args.lease_ttl_ms,
            renew_ms=max(1, args.lease_ttl_ms // 3),
        )
        asyncio.run(lease.acquire())
    config = PolicyConfig(
        window_ms=args.window_ms,
        step_ms=args.step_ms,
        models=tuple(args.model),
        lease=lease,
        metrics_port=args.metrics_port,
        scale=scale,
        instance_id=instance.instance_id,
        prometheus_url=args.prometheus_url or os.environ.get("GRAYLANE_PROMETHEUS_URL") or None,
        sharded=args.sharded,
    )
    try:
        asyncio.run(prepare_topics(settings, config))
    except UnshardableTopics as exc:
        raise SystemExit(str(exc)) from None
    app = create_app(settings, config)
    # faust's worker stops the app cleanly on SIGTERM / SIGINT and exits. It resets logging
    # at start: hand it our one handler instead of its coloured console.
    app.conf.loghandlers = [handler]
    worker = faust.Worker(
        app,
        loglevel=args.loglevel,
        logging_config={"version": 1, "disable_existing_loggers": False, "root": {"handlers": []}},
    )
    try:
        worker.execute_from_commandline()
    finally:
        if lease is not None:  # a clean stop hands the lease on at once
            asyncio.run(lease.release())
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m graylane.app.cli.policy``: the same command without the other subcommands."""
    parser = argparse.ArgumentParser(prog="graylane-policy")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["policy", *(argv if argv is not None else sys.argv[1:])])
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
