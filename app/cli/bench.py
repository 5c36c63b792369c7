"""``graylane bench ...``: benchmarks that print their figures (last line: JSON)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = sub.add_parser("bench", help="benchmarks; the last output line is one JSON object")
    which = bench.add_subparsers(dest="bench", metavar="BENCH", required=True)
    spine = which.add_parser("spine", help="engine vs end-to-end vs unbatched throughput")
    spine.add_argument("--size", choices=["tiny", "small"], default="small", help="demo GPT size")
    spine.add_argument("--requests", type=int, default=300, help="per saturation trial")
    spine.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians)")
    spine.add_argument("--max-batch", type=int, default=8, help="the worker's largest batch")
    spine.set_defaults(handler=_spine)
    path = which.add_parser(
        "path", help="the request path's own cost: a pre-filled queue drained, with ceilings"
    )
    path.add_argument("--size", choices=["tiny", "small"], default="tiny", help="demo GPT size")
    path.add_argument("--queue", type=int, default=20_000, help="requests pre-filled per drain")
    path.add_argument("--max-batch", type=int, default=32, help="the worker's largest batch")
    path.add_argument(
        "--max-wait-ms", type=int, default=5, help="the longest a batch waits to fill"
    )
    path.add_argument(
        "--fixed-batching", action="store_true", help="the worker's batch is not learned"
    )
    path.add_argument(
        "--engine-seconds", type=float, default=1.5, help="per batch size, engine alone"
    )
    path.add_argument(
        "--private-broker",
        action="store_true",
        help="a broker of the bench's own (free ports): its CPU is the path's alone",
    )
    path.set_defaults(handler=_path)
    engine = which.add_parser(
        "engine",
        help="an engine server (llama.cpp) direct vs through Graylane: tokens/s, TTFT, ITL",
    )
    engine.add_argument("--threads", type=int, default=1, help="the engine's threads")
    engine.add_argument("--slots", type=int, default=4, help="the engine's parallel sequences")
    engine.add_argument("--max-tokens", type=int, default=64, help="tokens per answer")
    engine.add_argument("--requests", type=int, default=3, help="calls per client, path and round")
    engine.add_argument("--rounds", type=int, default=3, help="rounds, the paths alternating")
    engine.add_argument(
        "--concurrency",
        default="",
        help="comma-separated concurrencies (default: 1, the slots, twice the slots)",
    )
    engine.set_defaults(handler=_engine)
    rollback = which.add_parser("rollback", help="time to roll back a bad canary; false rollbacks")
    rollback.add_argument(
        "--load-fraction",
        type=float,
        default=None,
        help="steady load as a fraction of the capacity measured here (fp32 engine, whole "
        "path; default 0.5)",
    )
    rollback.add_argument(
        "--rate", type=float, default=None, help="an explicit load in req/s instead"
    )
    rollback.add_argument(
        "--runs", type=int, default=10, help="rollouts to run (half with a bad candidate)"
    )
    rollback.add_argument("--window-ms", type=int, default=4000, help="policy engine window")
    rollback.add_argument("--step-ms", type=int, default=1000, help="policy engine step")
    rollback.set_defaults(handler=_rollback)
    scale = which.add_parser(
        "policy-scale",
        help="policy engines (one, or several sharded), N models x 3 versions: CPU, tick, "
        "decision latency, a killed instance's takeover",
    )
    scale.add_argument(
        "--sizes", default="10,100,1000,3000", help="comma-separated model counts, in order"
    )
    scale.add_argument(
        "--batches-per-s", type=float, default=1.0, help="telemetry records per version per second"
    )
    scale.add_argument(
        "--requests-per-batch", type=int, default=8, help="requests each record reports"
    )
    scale.add_argument("--measure-s", type=float, default=30.0, help="measured window per size")
    scale.add_argument("--regressions", type=int, default=8, help="injected per size")
    scale.add_argument("--window-ms", type=int, default=10_000, help="policy engine window")
    scale.add_argument("--step-ms", type=int, default=500, help="policy engine decision tick")
    scale.add_argument(
        "--max-decision-ms", type=float, default=2000.0, help="p99 decision latency bound"
    )
    scale.add_argument(
        "--instances",
        default="1",
        help="comma-separated policy-engine counts: 1 is one engine, more run sharded by "
        "model (--sharded), and one of them is killed (-9) after each size",
    )
    scale.add_argument(
        "--plot", type=Path, default=Path(".local/policy-scale.png"), help="where the plot goes"
    )
    scale.set_defaults(handler=_policy_scale)
    qos = which.add_parser("qos", help="a 3x overload spike with and without the QoS controller")
    qos.add_argument("--spike-s", type=float, default=40.0, help="how long the load spike lasts")
    qos.add_argument(
        "--base-fraction",
        type=float,
        default=0.5,
        help="steady load as a fraction of one fp32 worker's capacity measured here "
        "(the lower of the engine's, graylane calibrate, and the running stack's path)",
    )
    qos.add_argument(
        "--run",
        action="append",
        default=[],
        choices=["fp32_only", "qos", "qos_admission", "qos_admission_scale"],
        help="only this run (repeatable; default: all four; generative: all but qos)",
    )
    qos.add_argument(
        "--generative",
        action="store_true",
        help="generations of a KV-cache GPT, SLO stated as TTFT/TPOT p99, goodput against it",
    )
    qos.add_argument("--new-tokens", type=int, default=32, help="generative: mean output length")
    qos.add_argument(
        "--max-sequences", type=int, default=4, help="generative: the worker's decode rows"
    )
    qos.set_defaults(handler=_qos)
    generate = which.add_parser(
        "generate", help="KV-cache generation with iteration-level batching vs full recompute"
    )
    generate.add_argument(
        "--size", choices=["tiny", "small"], default="small", help="demo GPT size"
    )
    generate.add_argument("--requests", type=int, default=24, help="requests sent")
    generate.add_argument("--max-batch", type=int, default=8, help="the worker's largest batch")
    generate.add_argument("--new-tokens", type=int, default=64, help="tokens generated per request")
    generate.set_defaults(handler=_generate)
    llm = which.add_parser(
        "llm", help="streamed generation through Kafka vs the engine direct: TTFT, TPOT, tok/s"
    )
    llm.add_argument("--size", choices=["tiny", "small"], default="small", help="demo GPT size")
    llm.add_argument("--onnx", type=Path, default=None, help="a decoder-with-past of your own")
    llm.add_argument("--prompt-len", type=int, default=64, help="prompt tokens per request")
    llm.add_argument("--new-tokens", type=int, default=48, help="tokens generated per request")
    llm.add_argument(
        "--max-sequences", type=int, default=8, help="the worker's decode rows (the capacity)"
    )
    llm.add_argument(
        "--requests-per-client", type=int, default=4, help="requests each concurrent client sends"
    )
    llm.add_argument(
        "--stream-every-tokens", type=int, default=4, help="a streamed chunk every this many tokens"
    )
    llm.set_defaults(handler=_llm)
    gateway = which.add_parser(
        "gateway", help="the gateway's HTTP hop vs producing to Kafka directly: req/s, added ms"
    )
    gateway.add_argument("--concurrency", type=int, default=16, help="closed-loop callers")
    gateway.add_argument("--probe-s", type=float, default=8.0, help="each capacity probe")
    gateway.add_argument("--latency-s", type=float, default=12.0, help="each paced round")
    gateway.add_argument("--rounds", type=int, default=3, help="rounds (medians)")
    gateway.add_argument(
        "--load-fraction", type=float, default=0.5, help="paced load, of the direct capacity"
    )
    gateway.add_argument("--max-tokens", type=int, default=1, help="tokens per completion")
    gateway.set_defaults(handler=_gateway)
    decisions = which.add_parser(
        "decisions", help="the rollout controller on synthetic telemetry: detection, false alarms"
    )
    decisions.add_argument("--runs", type=int, default=40, help="runs per scenario at 50 req/s")
    decisions.add_argument(
        "--healthy-factor", type=int, default=5, help="healthy rollouts simulated per bad one"
    )
    decisions.add_argument("--rates", default="10,50,200", help="candidate req/s, comma-separated")
    decisions.add_argument(
        "--outcome-rates", default="10,50", help="rated answers/s of the A/B outcome scenarios"
    )
    decisions.add_argument("--workers", type=int, default=2, help="parallel simulation processes")
    decisions.add_argument(
        "--seed", type=int, default=11, help="random seed (same seed, same traffic)"
    )
    decisions.add_argument(
        "--mode", choices=["sequential", "fixed"], default="sequential", help="primary gate mode"
    )
    decisions.set_defaults(handler=_decisions)
    chaos = which.add_parser(
        "chaos", help="kill -9 services, stop the broker, send malformed records: nothing lost?"
    )
    chaos.add_argument("--quick", action="store_true", help="short phases and a 10 s outage")
    chaos.add_argument(
        "--outage-s", type=float, default=None, help="broker outage (default 60 s; quick 10 s)"
    )
    chaos.add_argument(
        "--load-fraction", type=float, default=0.5, help="steady load as a fraction of capacity"
    )
    chaos.add_argument("--max-rate", type=float, default=0.0, help="cap of the load, req/s")
    chaos.add_argument(
        "--malformed-per-kind", type=int, default=None, help="records per kind (default 40)"
    )
    chaos.add_argument("--work-dir", type=Path, default=None, help="logs and broker state")
    chaos.set_defaults(handler=_chaos)
    edge = which.add_parser(
        "edge",
        help="hostile HTTP callers from 3 tenants against a running gateway: peak RSS, "
        "server errors, a well-behaved tenant's success and p99",
    )
    edge.add_argument("--calls", type=int, default=10_000, help="hostile calls in all")
    edge.add_argument("--seed", type=int, default=34, help="the same seed sends the same calls")
    edge.add_argument(
        "--concurrency", type=int, default=8, help="hostile calls open at once, per tenant"
    )
    edge.add_argument("--quiet-s", type=float, default=20.0, help="the victim alone, first")
    edge.add_argument(
        "--storm",
        type=int,
        default=None,
        help="streams opened at once and hung up, beside the corpus (default: calls / 5)",
    )
    edge.set_defaults(handler=_edge)
    fuzz = which.add_parser(
        "fuzz", help="malformed records on every topic a service reads: does any service die?"
    )
    fuzz.add_argument("--records", type=int, default=1000, help="records per topic")
    fuzz.add_argument("--seed", type=int, default=23, help="the same seed writes the same records")
    fuzz.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="TOPIC",
        help="only this topic's burst "
        "(repeatable): ingress, version-stable, version-candidate, telemetry, shadow, commands, "
        "routing, precision, rollouts, scale, audit, lease",
    )
    fuzz.add_argument(
        "--without",
        action="append",
        default=[],
        metavar="DAMAGE",
        help="leave this kind of damage out (repeatable), e.g. header-key-not-utf8",
    )
    fuzz.add_argument("--work-dir", type=Path, default=None, help="logs and record summaries")
    fuzz.add_argument(
        "--window-ms", type=int, default=4000, help="policy engine window (each burst's canary)"
    )
    fuzz.add_argument("--step-ms", type=int, default=1000, help="policy engine step")
    fuzz.add_argument(
        "--restart-grace-s",
        type=float,
        default=20.0,
        help="how long a restarted service must stay up to count as alive",
    )
    fuzz.set_defaults(handler=_fuzz)
    admission = which.add_parser(
        "admission", help="a worker's admission cost per cycle: deadline vs priority shedding"
    )
    admission.add_argument(
        "--seconds-each", type=float, default=0.5, help="time each planner on each cycle shape"
    )
    admission.add_argument(
        "--seed", type=int, default=0, help="the same seed draws the same cycles"
    )
    admission.set_defaults(handler=_admission)
    from graylane.app.bench.variants import add_bench_variants_parser

    add_bench_variants_parser(which)


def _spine(args: argparse.Namespace) -> int:
    from graylane.app.bench.spine import SpineConfig, main

    return main(
        SpineConfig(
            size=args.size, requests=args.requests, max_batch=args.max_batch, rounds=args.rounds
        )
    )


def _path(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("confluent_kafka") is None:
        # the librdkafka hops and the queue filling; not a runtime dependency of Graylane
        raise SystemExit("graylane bench path needs the bench extra: pip install 'graylane[bench]'")
    from graylane.app.bench.path_cost import PathCostConfig, main

    return main(
        PathCostConfig(
            size=args.size,
            queue=args.queue,
            max_batch=args.max_batch,
            max_wait_ms=args.max_wait_ms,
            fixed_batching=args.fixed_batching,
            engine_seconds=args.engine_seconds,
            private_broker=args.private_broker,
        )
    )


def _rollback(args: argparse.Namespace) -> int:
    from graylane.app.bench.rollback import RollbackConfig, main

    fraction = {} if args.load_fraction is None else {"load_fraction": args.load_fraction}
    return main(
        RollbackConfig(
            **fraction,
            rate=args.rate,
            runs=args.runs,
            window_ms=args.window_ms,
            step_ms=args.step_ms,
        )
    )


def _policy_scale(args: argparse.Namespace) -> int:
    from graylane.app.bench.policy_scale import PolicyScaleConfig, main

    return main(
        PolicyScaleConfig(
            sizes=tuple(int(n) for n in args.sizes.split(",") if n.strip()),
            batches_per_s=args.batches_per_s,
            requests_per_batch=args.requests_per_batch,
            measure_s=args.measure_s,
            regressions=args.regressions,
            window_ms=args.window_ms,
            step_ms=args.step_ms,
            max_decision_ms=args.max_decision_ms,
            instances=tuple(int(k) for k in args.instances.split(",") if k.strip()),
            plot=args.plot,
        )
    )


def _qos(args: argparse.Namespace) -> int:
    from graylane.app.bench.qos import GenerativeConfig, QosConfig, main, main_generative

    if args.generative:
        return main_generative(
            QosConfig(spike_s=args.spike_s, base_fraction=args.base_fraction),
            GenerativeConfig(
                new_tokens=args.new_tokens,
                max_sequences=args.max_sequences,
                runs=tuple(args.run),
            ),
        )
    return main(
        QosConfig(spike_s=args.spike_s, base_fraction=args.base_fraction, runs=tuple(args.run))
    )


def _generate(args: argparse.Namespace) -> int:
    from graylane.app.bench.generate import GenerateBenchConfig, main

    return main(
        GenerateBenchConfig(
            size=args.size,
            requests=args.requests,
            max_batch=args.max_batch,
            new_tokens=args.new_tokens,
        )
    )


def _engine(args: argparse.Namespace) -> int:
    from graylane.app.bench.engine import EngineBenchConfig, main

    return main(
        EngineBenchConfig(
            threads=args.threads,
            slots=args.slots,
            max_tokens=args.max_tokens,
            requests=args.requests,
            rounds=args.rounds,
            concurrencies=tuple(int(c) for c in args.concurrency.split(",") if c.strip()),
        )
    )


def _llm(args: argparse.Namespace) -> int:
    from graylane.app.bench.llm import LlmBenchConfig, main

    return main(
        LlmBenchConfig(
            size=args.size,
            onnx=args.onnx,
            prompt_len=args.prompt_len,
            new_tokens=args.new_tokens,
            max_sequences=args.max_sequences,
            requests_per_client=args.requests_per_client,
            stream_every_tokens=args.stream_every_tokens,
        )
    )


def _gateway(args: argparse.Namespace) -> int:
    from graylane.app.bench.gateway import GatewayBenchConfig, main

    return main(
        GatewayBenchConfig(
            concurrency=args.concurrency,
            probe_s=args.probe_s,
            latency_s=args.latency_s,
            rounds=args.rounds,
            load_fraction=args.load_fraction,
            max_tokens=args.max_tokens,
        )
    )


def _decisions(args: argparse.Namespace) -> int:
    from graylane.app.bench.decisions import DecisionsConfig, main
    from graylane.rollouts.spec import GateMode

    return main(
        DecisionsConfig(
            rates=tuple(float(r) for r in args.rates.split(",")),
            runs=args.runs,
            healthy_factor=args.healthy_factor,
            workers=args.workers,
            seed=args.seed,
            mode=GateMode(args.mode),
            outcome_rates=tuple(float(r) for r in args.outcome_rates.split(",")),
        )
    )


def _chaos(args: argparse.Namespace) -> int:
    from graylane.app.bench.chaos_runner import ChaosConfig, main

    return main(
        ChaosConfig(
            quick=args.quick,
            outage_s=args.outage_s,
            load_fraction=args.load_fraction,
            max_rate=args.max_rate,
            malformed_per_kind=args.malformed_per_kind,
            work_dir=args.work_dir,
        )
    )


def _edge(args: argparse.Namespace) -> int:
    from graylane.app.bench.edge import EdgeBenchConfig, main

    return main(
        EdgeBenchConfig(
            calls=args.calls,
            seed=args.seed,
            concurrency=args.concurrency,
            quiet_s=args.quiet_s,
            storm=args.storm,
        )
    )


def _fuzz(args: argparse.Namespace) -> int:
    from graylane.app.bench.fuzz import FuzzConfig, main

    return main(
        FuzzConfig(
            records=args.records,
            seed=args.seed,
            only=tuple(args.only),
            without=frozenset(args.without),
            work_dir=args.work_dir,
            window_ms=args.window_ms,
            step_ms=args.step_ms,
            restart_grace_s=args.restart_grace_s,
        )
    )


def _admission(args: argparse.Namespace) -> int:
    from graylane.app.bench.admission import AdmissionBenchConfig, main

    return main(AdmissionBenchConfig(seconds_each=args.seconds_each, seed=args.seed))
