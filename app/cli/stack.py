"""``graylane up`` / ``down`` / ``topics``: the local stack."""

from __future__ import annotations

import argparse
import asyncio

from graylane.settings import Settings

__all__ = ["parse_model_versions", "register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    up = sub.add_parser(
        "up",
        help="start the local Kafka broker and create the shared topics; with --worker, "
        "then supervise worker processes as the policy engine's scale requests ask",
    )
    up.add_argument(
        "--with-prometheus",
        action="store_true",
        help="also start a local Prometheus that scrapes every locally started service",
    )
    up.add_argument(
        "--prometheus-port", type=int, default=9090, help="port of the local Prometheus"
    )
    from graylane.app.cli.scaler import add_supervisor_args

    add_supervisor_args(up, required=False)
    up.set_defaults(handler=_up)
    down = sub.add_parser("down", help="stop the local Kafka broker")
    down.set_defaults(handler=_down)
    topics = sub.add_parser("topics", help="create or repair Graylane's topics (idempotent)")
    topics.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="MODEL=V1,V2",
        help="also create the topics of a model and its versions (repeatable)",
    )
    topics.set_defaults(handler=_topics)


def _up(args: argparse.Namespace) -> int:
    from graylane.deploy.kafka import broker as kafka_broker

    kafka_broker.start()
    rc = _topics(argparse.Namespace(model=list(args.worker)))  # MODEL=VERSION: its topics
    if args.with_prometheus:
        from graylane.app.cli.local_prometheus import TARGETS, start_local_prometheus

        url = start_local_prometheus(args.prometheus_port)
        print(f"prometheus: {url} (targets: {url}/targets, rules: {url}/rules)")
        print(f"  scrapes every service `graylane demo` starts (target files in {TARGETS})")
    if args.worker and rc == 0:
        from graylane.app.cli.scaler import run_supervisor

        # In the foreground: Ctrl-C stops the workers; the broker keeps running.
        return run_supervisor(Settings.from_env(), args)
    return rc


def _down(args: argparse.Namespace) -> int:
    from graylane.app.cli.local_prometheus import stop_local_prometheus
    from graylane.deploy.kafka import broker as kafka_broker

    if stop_local_prometheus():
        print("prometheus: stopped")
    kafka_broker.stop()
    return 0


def parse_model_versions(items: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for item in items:
        model, _, versions = item.partition("=")
        out.setdefault(model, []).extend(v for v in versions.split(",") if v)
    return out


def _topics(args: argparse.Namespace) -> int:
    from graylane.kafka.admin import ensure_topics
    from graylane.kafka.seam import KafkaFactory

    factory = KafkaFactory(Settings.from_env())
    specs = factory.layout.shared_specs()
    for model, versions in parse_model_versions(args.model).items():
        specs += factory.layout.model_specs(model, versions)
    report = asyncio.run(ensure_topics(factory, specs))
    print(
        f"topics: {len(report.created)} created, {len(report.reconfigured)} reconfigured, "
        f"{len(report.unchanged)} already as specified"
    )
    return 0
