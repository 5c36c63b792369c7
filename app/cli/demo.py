"""``graylane demo``: a local stack serving two model versions, end to end."""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from graylane.clock import now_ms
from graylane.settings import REPO_ROOT, Settings

__all__ = [
    "MODEL",
    "Service",
    "demo_model_path",
    "free_port",
    "print_metrics_ports",
    "register",
    "start_service",
    "stop_services",
    "write_demo_models",
]

MODEL = "demo-gpt"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser(
        "demo",
        help="the local stack: a canary promoted, a bad one rolled back, SmolLM2's QoS ladder "
        "under a load spike",
    )
    demo.add_argument(
        "--quick",
        action="store_true",
        help="only serve requests through two versions at a fixed split (no policy engine)",
    )
    demo.add_argument("--requests", type=int, default=300, help="--quick: requests to send")
    demo.add_argument(
        "--size",
        choices=["tiny", "small"],
        default=None,
        help="demo GPT size (default: picked from this host's cores)",
    )
    demo.add_argument("--candidate-percent", type=float, default=30.0, help="--quick: v2 share")
    demo.add_argument(
        "--rate", type=float, default=None, help="steady load, requests/s (default: --load)"
    )
    demo.add_argument(
        "--load",
        type=float,
        default=0.5,
        help="steady load as a fraction of the stable fp32 variant's capacity measured here "
        "(the lower of the engine's and the running stack's path)",
    )
    demo.add_argument("--keep-running", action="store_true", help="leave broker and services up")
    demo.set_defaults(handler=_demo)

    model = sub.add_parser("demo-model", help="write the demo GPT model files (seeds 1 and 2)")
    model.add_argument(
        "--size",
        choices=["tiny", "small"],
        default="tiny",
        help="demo GPT size (default: picked from this host's cores)",
    )
    model.add_argument(
        "--out",
        type=Path,
        default=REPO_ROOT / ".local" / "models",
        help="folder the model files go to",
    )
    model.set_defaults(handler=_demo_model)


def demo_model_path(out: Path, size: str, seed: int) -> Path:
    return out / f"{MODEL}-{size}-seed{seed}.onnx"


def write_demo_models(out: Path, size: str) -> dict[str, Path]:
    from graylane.models.demo_gpt import write_demo_gpt

    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for version, seed in (("v1", 1), ("v2", 2)):
        path = demo_model_path(out, size, seed)
        if not path.exists():
            write_demo_gpt(path, size, seed=seed)
        paths[version] = path
    return paths


def _demo_model(args: argparse.Namespace) -> int:
    for version, path in write_demo_models(args.out, args.size).items():
        print(f"{version}: {path}")
    return 0


@dataclass
class Service:
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    metrics_port: int = 0


def start_service(
    name: str, argv: list[str], log_dir: Path, env: Mapping[str, str] | None = None
) -> Service:
    from graylane.app.cli.local_prometheus import announce

    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    handle = log.open("wb")
    extra = dict(env or {})
    if "GRAYLANE_METRICS_PORT" not in extra:
        # One port per process: a port this process inherited (a supervisor's own) is
        # never handed down, or every child after the first dies binding it.
        extra["GRAYLANE_METRICS_PORT"] = str(free_port())
    from graylane.app.cli.main import serve_argv

    process = subprocess.Popen(
        [sys.executable, "-m", "graylane.app.cli.main", *serve_argv(argv)],
        stdout=handle,
        stderr=subprocess.STDOUT,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **extra},
        start_new_session=True,
    )
    port = int(extra["GRAYLANE_METRICS_PORT"])
    if port > 0:
        announce(name, argv[0], port)
    return Service(name, process, log, port)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def print_metrics_ports(services: list[Service]) -> None:
    """Where to look: each service's /metrics, and the local Prometheus if one runs."""
    for s in services:
        if s.metrics_port > 0:
            print(f"    {s.name}: http://127.0.0.1:{s.metrics_port}/metrics", flush=True)
    print(
        "    Prometheus over all of them: `graylane up --with-prometheus` (http://127.0.0.1:9090)",
        flush=True,
    )


def stop_services(services: list[Service]) -> None:
    from graylane.app.cli.local_prometheus import withdraw

    for s in services:
        withdraw(s.name)
    for s in services:
        if s.process.poll() is None:
            s.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 20
    for s in services:
        try:
            s.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            s.process.kill()


def _demo(args: argparse.Namespace) -> int:
    if not args.quick:
        return _story(args)
    from graylane.deploy.kafka import broker as kafka_broker

    args.size = args.size or "tiny"

    step = _Steps()
    step("starting the local Kafka broker")
    kafka_broker.start()
    settings = Settings.from_env()
    step(f"writing the demo GPT ({args.size}) for versions v1 and v2")
    paths = write_demo_models(REPO_ROOT / ".local" / "models", args.size)
    log_dir = REPO_ROOT / ".local" / "logs"
    services: list[Service] = []
    try:
        asyncio.run(_prepare_topics(settings, MODEL, list(paths)))
        step("starting the router and one worker per version (logs in .local/logs)")
        services.append(start_service("router", ["router", "--model", f"{MODEL}=v1"], log_dir))
        for version, path in paths.items():
            services.append(
                start_service(
                    f"worker-{version}",
                    [
                        "worker",
                        "--model",
                        MODEL,
                        "--version",
                        version,
                        "--variant",
                        f"fp32={path}",
                        "--threads",
                        "1",
                    ],
                    log_dir,
                )
            )
        step("metrics of each service (/metrics, /healthz, /readyz):")
        print_metrics_ports(services)
        from graylane.app.demo.serve import run_serving_demo

        asyncio.run(
            run_serving_demo(
                settings,
                model=MODEL,
                requests=args.requests,
                candidate_percent=args.candidate_percent,
                services=services,
                step=step,
            )
        )
    finally:
        if not args.keep_running:
            step("stopping the services and the broker")
            stop_services(services)
            kafka_broker.stop()
    return 0


async def _prepare_topics(settings: Settings, model: str, versions: list[str]) -> None:
    from graylane.kafka.admin import ensure_topics
    from graylane.kafka.seam import KafkaFactory

    factory = KafkaFactory(settings)
    await ensure_topics(
        factory, factory.layout.shared_specs() + factory.layout.model_specs(model, versions)
    )


class _Steps:
    """Numbered steps, timed from the demo's start: the clock of the audit timeline and
    of the report's axis too."""

    def __init__(self) -> None:
        self.n = 0
        self.t0 = time.monotonic()
        self.t0_ms = now_ms()

    def __call__(self, text: str) -> None:
        self.n += 1
        print(f"[{time.monotonic() - self.t0:6.1f}s] {self.n}. {text}", flush=True)


def _capacity(
    settings: Settings, model: str, version: str, step: Callable[[str], None]
) -> dict[str, float]:
    """Requests/s of one worker per variant of ``version`` on this machine (calibrated
    once, then stored)."""
    from graylane.app.cli.capacity import ensure_calibrated, registered_variants
    from graylane.app.demo.story import StoryConfig
    from graylane.engine_worker.logic.batching import BucketPolicy

    seq_len = BucketPolicy().bucket_for(StoryConfig().prompt_len)
    files = registered_variants(settings, model, version)
    profile = ensure_calibrated(settings, model, version, files, seq_len=seq_len, progress=step)
    from graylane.capacity import rung_capacities

    capacities = dict(rung_capacities(profile, [v.variant for v in profile.variants]))
    figures = ", ".join(f"{v} {rps:.0f} req/s" for v, rps in capacities.items())
    step(f"measured capacity of one {model}/{version} worker on {profile.host}: {figures}")
    return capacities


def _start_controlplane(
    settings: Settings, model: str, stable: str, log_dir: Path, step: Callable[[str], None]
) -> Service:
    """The control plane (gRPC API + audit sink: it moves the registry's stable version on
    a promotion and serves ``rollout revert``), with a one-time operator token for the story."""
    from graylane.registry.repository import open_registry

    open_registry(settings.db_url).set_stable(model, stable)  # the story starts from it
    port, token = free_port(), f"demo-{uuid.uuid4().hex}"
    os.environ["GRAYLANE_CP_ADDR"] = f"127.0.0.1:{port}"
    os.environ["GRAYLANE_CP_TOKEN"] = token
    step(f"starting the control plane on 127.0.0.1:{port}; registry stable {model} {stable}")
    env = {"GRAYLANE_CP_PORT": str(port), "GRAYLANE_CP_TOKENS": f"{token}:operator:demo"}
    return start_service("controlplane", ["controlplane"], log_dir, env)


def _story(args: argparse.Namespace) -> int:
    from graylane.app.demo.build_versions import build_smollm2_onnx, build_versions
    from graylane.app.demo.engine_act import CHAT_MODEL, CHAT_VERSIONS, run_engine_act
    from graylane.app.demo.qos_act import (
        LADDER,
        QOS_MODEL,
        QOS_VERSION,
        chat_template_of,
        qos_table,
        run_qos_act,
    )
    from graylane.app.demo.report import write_report
    from graylane.app.demo.story import (
        BAD,
        SEEDS,
        STABLE,
        Story,
        StoryConfig,
        audit_table,
    )
    from graylane.app.demo.story import (
        MODEL as STORY_MODEL,
    )
    from graylane.deploy.engines import llamacpp
    from graylane.deploy.kafka import broker as kafka_broker
    from graylane.kafka.seam import KafkaFactory

    step = _Steps()
    step("starting the local Kafka broker")
    kafka_broker.start()
    settings = Settings.from_env()
    size = args.size or "small"
    step(f"building versions {', '.join(SEEDS)} of {STORY_MODEL} ({size}): fp32 + int8-dynamic")
    build_versions(settings, STORY_MODEL, SEEDS, size=size)
    step(
        f"building {QOS_MODEL} {QOS_VERSION}: SmolLM2-135M-Instruct imported from its GGUF "
        f"into ONNX, rungs {', '.join(LADDER)} (minutes the first time; cached after)"
    )
    build_smollm2_onnx(settings, QOS_MODEL, QOS_VERSION, LADDER, gguf=llamacpp.model())
    # On a quiet machine, before any worker loads and warms its engines: calibrated while
    # the other versions' workers warmed up, fp32 measured 8 req/s instead of ~45 on 2
    # cores, and the spike computed from it was x15.9.
    capacities = _capacity(settings, STORY_MODEL, STABLE, step)
    log_dir = REPO_ROOT / ".local" / "logs"
    services: list[Service] = []
    try:
        asyncio.run(_prepare_topics(settings, STORY_MODEL, list(SEEDS)))
        step("starting router, policy engine and one worker per version (logs in .local/logs)")
        asyncio.run(_prepare_topics(settings, CHAT_MODEL, list(CHAT_VERSIONS)))
        asyncio.run(_prepare_topics(settings, QOS_MODEL, [QOS_VERSION]))
        router_models = [
            "--model",
            f"{STORY_MODEL}={STABLE}",
            "--model",
            f"{CHAT_MODEL}={CHAT_VERSIONS[0]}",
            "--model",
            f"{QOS_MODEL}={QOS_VERSION}",
        ]
        services.append(start_service("router", ["router", *router_models], log_dir))
        services.append(
            start_service(
                "policy",
                [
                    "policy",
                    "--model",
                    STORY_MODEL,
                    "--model",
                    CHAT_MODEL,
                    "--model",
                    QOS_MODEL,
                    "--window-ms",
                    "6000",
                    "--step-ms",
                    "1000",
                ],
                log_dir,
            )
        )
        for version in SEEDS:
            faults = (
                ["--inject-latency-factor", "4", "--inject-error-rate", "0.3"]
                if version == BAD
                else []
            )
            services.append(
                start_service(
                    f"worker-{version}",
                    [
                        "worker",
                        "--model",
                        STORY_MODEL,
                        "--version",
                        version,
                        "--from-registry",
                        "--threads",
                        "1",
                        *faults,
                    ],
                    log_dir,
                )
            )
        services.append(_start_controlplane(settings, STORY_MODEL, STABLE, log_dir, step))
        gateway_port, gateway_key = free_port(), secrets.token_hex(16)
        services.append(
            start_service(
                "gateway",
                ["gateway", "--port", str(gateway_port), "--replica", "demo"],
                log_dir,
                {"GRAYLANE_GATEWAY_KEYS": f"{gateway_key}:infer:demo:100000:100000"},
            )
        )
        step(
            f"API gateway on http://127.0.0.1:{gateway_port} (OpenAI /v1, Open Inference "
            "Protocol /v2), ready for calls; the story's load goes straight to Kafka"
        )
        step("metrics of each service (/metrics, /healthz, /readyz):")
        print_metrics_ports(services)
        run_engine_act(
            KafkaFactory(settings),
            log_dir,
            step,
            gateway_url=f"http://127.0.0.1:{gateway_port}",
            gateway_key=gateway_key,
        )
        qos, qos_monitor = run_qos_act(
            KafkaFactory(settings),
            log_dir,
            step,
            template=chat_template_of(settings),
            clock_origin=step.t0,
        )
        rate = args.rate or args.load * capacities["fp32"]
        cfg = StoryConfig(
            rate=rate,
            load_fraction=0.0 if args.rate else args.load,
            engine_rps=capacities["fp32"],
            report=REPO_ROOT / ".local" / "report.png",
            gateway_port=gateway_port,
            gateway_key=gateway_key,
            # Its one-token completions are GENERATE batches among the story's FORWARD
            # ones: mixed in, the canary's gates did not reach promotion in the story's
            # budget, so the story keeps one kind of traffic.
            gateway_share=0.0,
        )
        story = Story(settings, cfg, step, clock_origin=step.t0)
        step(
            f"steady load of {rate:.0f} req/s"
            + ("" if args.rate else ", or less once the path's capacity is measured")
            + "; the live view follows"
        )
        records = asyncio.run(story.run())
        from graylane.app.demo.monitor import demo_console

        demo_console().print(audit_table(records, step.t0_ms))
        demo_console().print(qos_table(qos, step.t0_ms))
        story.monitor.timeline.events.extend(qos_monitor.timeline.events)
        story.monitor.timeline.variants[f"{QOS_MODEL} {QOS_VERSION}"] = (
            qos_monitor.timeline.variants.get(QOS_VERSION, [])
        )
        path = write_report(story.monitor, cfg.report)
        step(f"report written: {path}")
        print(f"requests: {story.monitor.total}, error results: {story.monitor.errors}")
        for at, text in sorted(story.monitor.timeline.events):
            print(f"  t+{at:6.1f}s  {text}")
    finally:
        if not args.keep_running:
            step("stopping the services and the broker")
            stop_services(services)
            kafka_broker.stop()
    return 0
