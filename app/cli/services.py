"""``graylane serve router`` / ``serve worker`` / ``serve gateway``: the long-running services."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

from graylane.settings import Settings

__all__ = ["add_observability_args", "register", "run_service", "setup_service_logging"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    router = sub.add_parser("router", help="route ingress requests to per-version topics")
    router.add_argument(
        "--model",
        action="append",
        required=True,
        metavar="MODEL=STABLE_VERSION",
        help="a model this router serves and its stable version (repeatable)",
    )
    add_observability_args(router)
    router.set_defaults(handler=_router)

    worker = sub.add_parser("worker", help="serve one model version from Kafka")
    worker.add_argument("--model", required=True, help="the model served")
    worker.add_argument("--version", required=True, help="the model version served")
    worker.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="an ONNX variant to load (repeatable); the first is active unless --active",
    )
    worker.add_argument(
        "--from-registry",
        action="store_true",
        help="load the servable variants of MODEL/VERSION from the registry and artifact store",
    )
    worker.add_argument(
        "--trust-key",
        type=Path,
        action="append",
        default=[],
        metavar="PUBLIC_KEY",
        help="load only registry artifacts signed by this key (repeatable; default: "
        "GRAYLANE_TRUSTED_KEYS); unsigned or tampered ones are refused",
    )
    worker.add_argument(
        "--require-signatures",
        action="store_true",
        default=None,
        help="fail closed: refuse to start when no trusted key is found, instead of loading "
        "artifacts unchecked (default: GRAYLANE_REQUIRE_SIGNATURES; needs --from-registry)",
    )
    worker.add_argument(
        "--require-tensorrt",
        action="store_true",
        help="refuse to start unless every variant runs on TensorRT (GPU pods: never fall "
        "back to ONNX Runtime on CPU while holding a GPU)",
    )
    worker.add_argument("--active", help="variant to start with")
    worker.add_argument("--max-batch", type=int, default=8, help="largest batch per engine call")
    worker.add_argument("--max-wait-ms", type=int, default=5, help="how long a batch waits to fill")
    worker.add_argument(
        "--fixed-batching",
        action="store_true",
        help="always wait --max-wait-ms for --max-batch (no learned batch size and wait)",
    )
    worker.add_argument(
        "--default-deadline-ms",
        type=float,
        default=0.0,
        help="deadline of requests naming none, from creation (0 = none); late ones are shed",
    )
    worker.add_argument("--max-seq-len", type=int, default=0, help="0 = from the model")
    gen = worker.add_argument_group("generation (models with a KV cache)")
    gen.add_argument(
        "--max-sequences",
        type=int,
        default=0,
        help="sequences decoding together in the running batch (0 = --max-batch)",
    )
    gen.add_argument(
        "--max-prefill-tokens",
        type=int,
        default=0,
        help="prompt tokens prefilled in one decode step (0 = no cap)",
    )
    gen.add_argument(
        "--max-kv-tokens",
        type=int,
        default=0,
        help="cache positions the running sequences reserve together, prompt + max new "
        "tokens each (0 = no cap)",
    )
    gen.add_argument(
        "--kv-cache-mb",
        type=float,
        default=512.0,
        help="memory for the KV cache of the running sequences (MiB): caps the positions "
        "they reserve together, rows x length (--max-kv-tokens, when given, wins; 0 = no cap)",
    )
    gen.add_argument(
        "--max-new-tokens",
        type=int,
        default=256,
        help="the most tokens one generation may ask for",
    )
    gen.add_argument(
        "--stream-every-tokens",
        type=int,
        default=4,
        help="a streamed generation publishes a chunk once it has this many new tokens",
    )
    gen.add_argument(
        "--stream-every-ms",
        type=float,
        default=50.0,
        help="... or once this many ms passed since its previous chunk",
    )
    gen.add_argument(
        "--per-batch-generation",
        action="store_true",
        help="decode GENERATE requests per fetched batch instead of one continuous batch",
    )
    worker.add_argument("--threads", type=int, default=0, help="engine threads (0 = default)")
    worker.add_argument(
        "--warmup-max-len",
        type=int,
        default=512,
        help="the longest sequence warmed before joining the group (0 = every bucket up to "
        "the model's limit)",
    )
    worker.add_argument(
        "--warmup-budget-s",
        type=float,
        default=30.0,
        help="time warm-up may take; shapes left over warm on their first batch (0 = no limit)",
    )
    _engine_server_args(worker)
    add_observability_args(worker)
    worker.add_argument("--worker-id", default="", help="this worker's id (default: host and pid)")
    worker.add_argument(
        "--standby",
        action="store_true",
        help="warm up, then wait out of the consumer group until SIGUSR1 (a supervisor's "
        "warm standby: scale-out without a cold start)",
    )
    worker.add_argument(
        "--engine-failure-limit",
        type=int,
        default=5,
        help="consecutive failed batches before the engine is reloaded, then before the "
        "worker exits non-zero (0 = never)",
    )
    worker.add_argument("--inject-latency-ms", type=float, default=0.0, help="tests/demos only")
    worker.add_argument("--inject-latency-factor", type=float, default=1.0, help="tests/demos only")
    worker.add_argument("--inject-error-rate", type=float, default=0.0, help="tests/demos only")
    worker.add_argument(
        "--inject-latency-jitter-ms", type=float, default=0.0, help="tests/demos only"
    )
    worker.add_argument(
        "--inject-decode-step-ms",
        type=float,
        default=0.0,
        help="tests/demos only: extra ms per decode step of a generation (not its prefill)",
    )
    worker.set_defaults(handler=_worker)
    _register_gateway(sub)


def _engine_server_args(worker: argparse.ArgumentParser) -> None:
    from graylane.artifacts.naming import Backend
    from graylane.engine.server import DEFAULT_SLOTS
    from graylane.engine_worker.engine_server import EngineServerSettings

    d = EngineServerSettings()
    eng = worker.add_argument_group(
        "engine servers (serve through vLLM, TensorRT-LLM, SGLang or llama.cpp instead of "
        "loading an ONNX file)"
    )
    eng.add_argument(
        "--endpoint",
        action="append",
        default=[],
        metavar="VARIANT=URL",
        help="a variant served by an OpenAI-compatible engine server at URL (repeatable; "
        "best first: the QoS ladder), e.g. q4_1=http://127.0.0.1:8081",
    )
    eng.add_argument(
        "--engine",
        choices=[b.value for b in Backend if b.is_engine_server],
        default=Backend.VLLM.value,
        help="which engine serves the endpoints: where its load figures are read",
    )
    eng.add_argument("--engine-version", default="", help="the engine's version (on record)")
    eng.add_argument(
        "--engine-model",
        default="",
        help="the model each call names: the engine's served model or a LoRA adapter id "
        "(default: the first the server lists at /v1/models)",
    )
    eng.add_argument(
        "--engine-slots",
        type=int,
        default=DEFAULT_SLOTS,
        help="calls in flight to each endpoint: the engine's parallel sequences",
    )
    eng.add_argument(
        "--engine-max-waiting",
        type=int,
        default=d.max_waiting,
        help="requests held waiting for a slot per endpoint (0 = 4 x slots); beyond it they "
        "wait in Kafka",
    )
    eng.add_argument(
        "--engine-stall-timeout-s",
        type=float,
        default=d.stall_timeout_s,
        help="a call that sends nothing for this long has failed",
    )
    eng.add_argument(
        "--engine-retry-budget-s",
        type=float,
        default=d.retry_budget_s,
        help="a call refused before anything was sent is tried again within this",
    )


def _endpoints(args: argparse.Namespace) -> tuple[Any, ...]:
    """The ``--endpoint`` options as engine endpoints, best first."""
    from graylane.artifacts.naming import Backend
    from graylane.engine.server import EndpointError, EngineEndpoint

    endpoints = []
    for item in args.endpoint:
        variant, _, url = item.partition("=")
        if not variant or not url:
            raise SystemExit(f"--endpoint {item!r}: expected VARIANT=URL")
        try:
            endpoints.append(
                EngineEndpoint(
                    variant=variant,
                    url=url,
                    backend=Backend(args.engine),
                    engine_version=args.engine_version,
                    served_model=args.engine_model,
                    slots=args.engine_slots,
                )
            )
        except EndpointError as exc:
            raise SystemExit(f"--endpoint {item!r}: {exc}") from None
    return tuple(endpoints)


def _register_gateway(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from graylane.services.gateway.logic.admission import GatewayLimits

    d = GatewayLimits()
    gateway = sub.add_parser(
        "gateway",
        help="HTTP API gateway: OpenAI-compatible and Open Inference Protocol v2 over Kafka",
    )
    gateway.add_argument("--host", default="127.0.0.1", help="0.0.0.0 in containers")
    gateway.add_argument("--port", type=int, default=8080, help="0 = a free port (printed)")
    gateway.add_argument(
        "--replica",
        default="",
        help="names this replica's reply topic (<p>.reply.gateway-<replica>); unique per "
        "running replica (default: GRAYLANE_INSTANCE_ID, else the host name)",
    )
    auth = gateway.add_mutually_exclusive_group()
    auth.add_argument(
        "--keys-file",
        type=Path,
        default=None,
        help="API keys, KEY:infer:TENANT[:RATE_PER_S[:BURST[:PRIORITIES[:TAGS]]]] per line "
        "(PRIORITIES and TAGS '+'-separated; default priority standard, no tags; also read: "
        "GRAYLANE_GATEWAY_KEYS, comma-separated)",
    )
    auth.add_argument(
        "--no-auth",
        action="store_true",
        help="no API keys: anyone who reaches the port may call (loopback only, unless "
        "--no-auth-beyond-loopback)",
    )
    gateway.add_argument(
        "--no-auth-beyond-loopback",
        action="store_true",
        help="allow --no-auth on a host other than loopback (an open gateway, on purpose)",
    )
    gateway.add_argument(
        "--signature",
        action="append",
        default=[],
        metavar="MODEL[@VERSION]=ONNX",
        help="an ONNX file whose inputs/outputs answer /v2 model metadata (repeatable)",
    )
    gateway.add_argument(
        "--chat-template",
        action="append",
        default=[],
        metavar="MODEL=PATH",
        help="a model's own chat template: its export folder or tokenizer_config.json "
        "(chat_template; ChatML for models without one; repeatable)",
    )
    gateway.add_argument(
        "--signatures-from-registry",
        action="store_true",
        help="else read model signatures from the registry's manifests (GRAYLANE_DB_URL)",
    )
    lim = gateway.add_argument_group("admission")
    lim.add_argument(
        "--max-body-bytes",
        type=int,
        default=d.max_body_bytes,
        help="largest request body (413 above)",
    )
    lim.add_argument(
        "--max-prompt-chars", type=int, default=d.max_prompt_chars, help="longest prompt accepted"
    )
    lim.add_argument("--max-tokens", type=int, default=d.max_tokens, help="cap of max_tokens")
    lim.add_argument(
        "--default-max-tokens",
        type=int,
        default=d.default_max_tokens,
        help="max_tokens of a chat completion that names none",
    )
    lim.add_argument(
        "--default-timeout-s",
        type=float,
        default=d.default_timeout_s,
        help="a request's timeout when it names none",
    )
    lim.add_argument(
        "--max-timeout-s",
        type=float,
        default=d.max_timeout_s,
        help="the longest timeout a request may ask for",
    )
    lim.add_argument(
        "--rate", type=float, default=d.default_rate_per_s, help="calls/s of a key naming none"
    )
    lim.add_argument(
        "--burst", type=int, default=d.default_burst, help="token bucket size per API key"
    )
    lim.add_argument(
        "--max-in-flight",
        type=int,
        default=d.max_in_flight,
        help="calls this replica runs at once; beyond it 503 (sheddable calls first)",
    )
    lim.add_argument(
        "--replicas",
        type=int,
        default=int(os.environ.get("GRAYLANE_GATEWAY_REPLICAS", "1") or "1"),
        help="the most gateway replicas that run at once (the HPA's maxReplicas): each "
        "holds 1/N of every key's rate limit (default: GRAYLANE_GATEWAY_REPLICAS, else 1)",
    )
    gateway.add_argument(
        "--remembered-answers",
        type=int,
        default=100_000,
        help="answers this replica remembers for POST /v1/feedback (the oldest forgotten)",
    )
    add_observability_args(gateway)
    gateway.set_defaults(handler=_gateway)


def add_observability_args(parser: argparse.ArgumentParser) -> None:
    """``--metrics-port`` and ``--log-format``, shared by every long-running service."""
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="port of /metrics /healthz /readyz (default GRAYLANE_METRICS_PORT; 0 = a free "
        "port, printed at start; below 0 = off)",
    )
    parser.add_argument(
        "--log-format",
        choices=("json", "text"),
        default=None,
        help="log lines as JSON (default, GRAYLANE_LOG_FORMAT) or text for humans",
    )


def setup_service_logging(
    service: str, settings: Settings, args: argparse.Namespace, **context: str
) -> logging.Handler:
    """The library's one logging set-up, with the CLI's ``--log-format`` over the setting;
    and span export, where the ``OTEL_*`` variables ask for it (:mod:`graylane.tracing`)."""
    import os

    from graylane.logs import LogFormat, configure_logging
    from graylane.tracing import configure_tracing

    configure_tracing(service, os.environ)
    fmt = LogFormat(args.log_format) if args.log_format else settings.logs()
    return configure_logging(
        service,
        fmt,
        git_sha=settings.git_sha,
        build_time=settings.build_time,
        image_version=settings.image_version,
        context=context,
    )


def run_service(
    main: Callable[[asyncio.Event], Coroutine[Any, Any, None]],
    *,
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
) -> int:
    """Run a service until SIGINT/SIGTERM, then shut it down cleanly.

    What the process built before it serves (the modules it imported, the service's own
    objects) is first moved out of the garbage collector's reach (``gc.freeze``): a full
    collection then walks only what the service makes while it runs. Its pauses hold the
    event loop; the gateway's took 75-144 ms, several times a minute under load.
    """
    gc.collect()
    gc.freeze()

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    with asyncio.Runner(loop_factory=loop_factory) as run:
        run.run(runner())
    return 0


def _router(args: argparse.Namespace) -> int:
    from graylane.kafka.seam import KafkaFactory
    from graylane.services.router.service import Router, RouterConfig

    stable = {}
    for item in args.model:
        model, _, version = item.partition("=")
        if not version:
            raise SystemExit(f"--model {item!r}: expected MODEL=STABLE_VERSION")
        stable[model] = version
    settings = Settings.from_env()
    setup_service_logging("router", settings, args)
    router = Router(
        KafkaFactory(settings), RouterConfig(stable_versions=stable, metrics_port=args.metrics_port)
    )
    return run_service(router.run)


def _worker(args: argparse.Namespace) -> int:
    from graylane.artifacts.build_info import ShapeProfile
    from graylane.artifacts.model_info import ModelInfo
    from graylane.engine.protocol import InferenceEngine
    from graylane.engine_worker.compute import WarmUpLimits, profile_max_batch
    from graylane.engine_worker.config import WorkerConfig
    from graylane.engine_worker.faults import FaultInjection
    from graylane.engine_worker.loading import load_from_paths, onnx_max_seq_len, onnx_model_info
    from graylane.engine_worker.logic.streaming import StreamPolicy
    from graylane.engine_worker.service import Worker
    from graylane.kafka.seam import KafkaFactory
    from graylane.models.hf_tokenizer import HfTokenizer, tokenizer_beside

    settings = Settings.from_env()
    if args.trust_key:
        settings = settings.with_overrides(trusted_keys=tuple(args.trust_key))
    setup_service_logging("worker", settings, args, model=args.model, version=args.version)
    if args.require_signatures:
        settings = settings.with_overrides(require_signatures=True)
    if settings.trusted_keys and not args.from_registry:
        raise SystemExit("trusted keys verify signed artifacts: use them with --from-registry")
    if args.require_signatures and not args.from_registry:
        raise SystemExit(
            "--require-signatures: only registry artifacts carry signatures; "
            "use it with --from-registry"
        )
    if args.from_registry:
        from graylane.artifacts.signing import TrustedKeyError

        try:
            settings.verifying_keys()  # told to verify but no key: refuse to start
        except TrustedKeyError as exc:
            raise SystemExit(f"worker refuses to start: {exc}") from None
    if args.endpoint:
        if args.variant or args.from_registry:
            raise SystemExit("--endpoint serves through engine servers: not with --variant")
        return _serve_engine_servers(args, settings, _endpoints(args))
    threads = args.threads or None
    first_path: Path | None
    if args.from_registry:
        from graylane.engine_worker.loading import load_from_registry

        def reload() -> Mapping[str, InferenceEngine]:
            again = load_from_registry(settings, args.model, args.version, intra_op_threads=threads)
            worker.observer.count_refused(again.refused)  # an artifact changed since start
            return again.engines

        loaded = load_from_registry(settings, args.model, args.version, intra_op_threads=threads)
        if loaded.endpoints and not loaded.engines:  # a version served by engine servers
            return _serve_engine_servers(args, settings, loaded.endpoints, loaded.refused)
        if loaded.endpoints:
            raise SystemExit(
                f"{args.model} {args.version} names both ONNX variants and engine endpoints: "
                "a worker serves one kind"
            )
        engines, first_path = loaded.engines, loaded.fp32_path
        info: ModelInfo | None = loaded.model_info
        profiles: tuple[ShapeProfile, ...] = loaded.profiles
        tokenizer: HfTokenizer | None = loaded.tokenizer
        refused = loaded.refused
    else:
        paths: dict[str, Path] = {}
        for item in args.variant:
            name, _, path = item.partition("=")
            if not path:
                raise SystemExit(f"--variant {item!r}: expected NAME=PATH")
            paths[name] = Path(path)
        if not paths:
            raise SystemExit("give --variant NAME=PATH at least once, or --from-registry")

        def reload() -> Mapping[str, InferenceEngine]:
            return load_from_paths(paths, model=args.model, intra_op_threads=threads)

        engines = dict(reload())
        first_path = next(iter(paths.values()))
        info, profiles = onnx_model_info(first_path), ()
        tokenizer = tokenizer_beside(first_path)  # an export folder's tokenizer.json
        refused = ()
    if args.require_tensorrt:
        _require_tensorrt(engines, loaded.skipped if args.from_registry else {})
    active = args.active or next(iter(engines))
    max_seq = (
        args.max_seq_len
        or (info.max_seq_len if info is not None else None)
        or (onnx_max_seq_len(first_path) if first_path else None)
        or 256
    )
    config = WorkerConfig(
        model=args.model,
        version=args.version,
        initial_variant=active,
        max_batch_size=min(args.max_batch, profile_max_batch(profiles) or args.max_batch),
        max_wait_ms=args.max_wait_ms,
        adaptive_batching=not args.fixed_batching,
        default_deadline_ms=args.default_deadline_ms,
        engine_failure_limit=args.engine_failure_limit,
        max_seq_len=max_seq,
        max_new_tokens=args.max_new_tokens,
        buckets=_buckets_up_to(max_seq),  # the worker prefers the profiles' buckets
        model_info=info,
        profiles=profiles,
        tokenizer=tokenizer,
        metrics_port=args.metrics_port,
        standby=args.standby,
        continuous_batching=not args.per_batch_generation,
        max_sequences=args.max_sequences,
        max_prefill_tokens=args.max_prefill_tokens,
        max_kv_tokens=args.max_kv_tokens or _kv_tokens(engines, args.kv_cache_mb),
        warm_up=WarmUpLimits(
            max_len=args.warmup_max_len or None, budget_s=args.warmup_budget_s or None
        ),
        stream=StreamPolicy(every_tokens=args.stream_every_tokens, every_ms=args.stream_every_ms),
        faults=FaultInjection(
            extra_latency_ms=args.inject_latency_ms,
            latency_factor=args.inject_latency_factor,
            error_rate=args.inject_error_rate,
            latency_jitter_ms=args.inject_latency_jitter_ms,
            decode_step_latency_ms=args.inject_decode_step_ms,
        ),
        refused_artifacts=refused,
        **({"worker_id": args.worker_id} if args.worker_id else {}),
    )
    worker = Worker(KafkaFactory(settings), config, engines, reload=reload)
    return run_service(worker.run)


def _serve_engine_servers(
    args: argparse.Namespace, settings: Settings, endpoints: tuple[Any, ...], refused: Any = ()
) -> int:
    """A worker that serves its variants through engine servers."""
    from graylane.engine_worker.config import WorkerConfig
    from graylane.engine_worker.engine_server import EngineServerSettings
    from graylane.engine_worker.logic.streaming import StreamPolicy
    from graylane.engine_worker.service import Worker
    from graylane.kafka.seam import KafkaFactory

    variants = [e.variant for e in endpoints]
    if args.active and args.active not in variants:
        raise SystemExit(f"--active {args.active!r} is not one of the endpoints' {variants}")
    config = WorkerConfig(
        model=args.model,
        version=args.version,
        initial_variant=args.active or variants[0],
        endpoints=endpoints,
        engine_server=EngineServerSettings(
            stall_timeout_s=args.engine_stall_timeout_s,
            retry_budget_s=args.engine_retry_budget_s,
            max_waiting=args.engine_max_waiting,
        ),
        max_new_tokens=args.max_new_tokens,
        metrics_port=args.metrics_port,
        stream=StreamPolicy(every_tokens=args.stream_every_tokens, every_ms=args.stream_every_ms),
        refused_artifacts=refused,
        **({"worker_id": args.worker_id} if args.worker_id else {}),
    )
    worker = Worker(KafkaFactory(settings), config)
    return run_service(worker.run)


def _kv_tokens(engines: Mapping[str, Any], budget_mb: float) -> int:
    """Cache positions ``budget_mb`` holds for the engines' decoder (0: no decoder, or no cap)."""
    from graylane.engine_worker.layouts import kv_cache_layout, kv_tokens_for

    layouts = [layout for e in engines.values() if (layout := kv_cache_layout(e.io)) is not None]
    if not layouts or budget_mb <= 0:
        return 0
    return min(kv_tokens_for(layout, budget_mb) for layout in layouts)


def _buckets_up_to(max_seq: int) -> tuple[int, ...]:
    from graylane.engine_worker.logic.batching import BucketPolicy

    return BucketPolicy.powers_of_two(max_seq, 1).buckets


def _gateway(args: argparse.Namespace) -> int:
    import os
    import socket

    from graylane.kafka.seam import KafkaFactory
    from graylane.services.gateway.chat import ChatFormat, ChatTemplateError, load_chat_template
    from graylane.services.gateway.logic.admission import GatewayLimits, KeyRing, exposure_problem
    from graylane.services.gateway.service import Gateway, GatewayConfig

    settings = Settings.from_env()
    setup_service_logging("gateway", settings, args)
    keys = (
        None
        if args.no_auth
        else KeyRing.from_sources(os.environ.get("GRAYLANE_GATEWAY_KEYS"), args.keys_file)
    )
    problem = exposure_problem(args.host, keys, forced=args.no_auth_beyond_loopback)
    if problem is not None:
        raise SystemExit(problem)
    signatures: dict[tuple[str, str], Path] = {}
    for item in args.signature:
        name, _, path = item.partition("=")
        model, _, version = name.partition("@")
        if not model or not path:
            raise SystemExit(f"--signature {item!r}: expected MODEL[@VERSION]=ONNX")
        signatures[(model, version)] = Path(path)
    templates: dict[str, ChatFormat] = {}
    for item in args.chat_template:
        model, _, path = item.partition("=")
        if not model or not path:
            raise SystemExit(f"--chat-template {item!r}: expected MODEL=PATH")
        try:
            template = load_chat_template(Path(path))
        except ChatTemplateError as exc:
            raise SystemExit(f"--chat-template {item!r}: {exc}") from None
        if template is None:
            raise SystemExit(f"--chat-template {item!r}: {path} has no chat_template")
        templates[model] = template
    config = GatewayConfig(
        host=args.host,
        port=args.port,
        replica=args.replica or settings.instance_id or socket.gethostname(),
        limits=GatewayLimits(
            max_body_bytes=args.max_body_bytes,
            max_prompt_chars=args.max_prompt_chars,
            max_tokens=args.max_tokens,
            default_max_tokens=args.default_max_tokens,
            default_timeout_s=args.default_timeout_s,
            max_timeout_s=args.max_timeout_s,
            default_rate_per_s=args.rate,
            default_burst=args.burst,
            max_in_flight=args.max_in_flight,
            replicas=args.replicas,
        ),
        signatures=signatures,
        templates=templates,
        registry_signatures=args.signatures_from_registry,
        metrics_port=args.metrics_port,
        remembered_answers=args.remembered_answers,
    )
    gateway = Gateway(KafkaFactory(settings), config, keys)
    try:  # uvloop where it is installed: about 15 % less CPU per call than asyncio's loop
        import uvloop
    except ImportError:
        return run_service(gateway.run)
    return run_service(gateway.run, loop_factory=uvloop.new_event_loop)


def _require_tensorrt(engines: Mapping[str, Any], skipped: Mapping[str, str]) -> None:
    """Exit unless every loaded engine is a TensorRT one (GPU pods never fall back)."""
    from graylane.engine.onnxruntime import OnnxRuntimeEngine

    on_cpu = sorted(v for v, e in engines.items() if isinstance(e, OnnxRuntimeEngine))
    if on_cpu or not engines:
        why = "; ".join(f"{name}: {reason}" for name, reason in skipped.items())
        raise SystemExit(
            f"--require-tensorrt: {', '.join(on_cpu) or 'nothing'} would be served by ONNX "
            f"Runtime on CPU, not TensorRT" + (f" ({why})" if why else "")
        )
