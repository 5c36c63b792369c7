"""``graylane serve audit-sink``: copy decisions and rollout states into SQL (own process/pod)."""

from __future__ import annotations

import argparse

from graylane.app.cli.services import add_observability_args


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sink = sub.add_parser("audit-sink", help="copy audit records and rollout states into SQL")
    add_observability_args(sink)
    sink.set_defaults(handler=_audit_sink)


def _audit_sink(args: argparse.Namespace) -> int:
    import asyncio

    from graylane.app.cli.services import run_service, setup_service_logging
    from graylane.kafka.seam import KafkaFactory
    from graylane.services.controlplane.sink_process import serve_audit_sink
    from graylane.settings import Settings

    settings = Settings.from_env()
    setup_service_logging("audit-sink", settings, args)
    factory = KafkaFactory(settings)

    async def main(stop: asyncio.Event) -> None:
        await serve_audit_sink(factory, stop, args.metrics_port)

    return run_service(main)
