"""``graylane bench qos``: a 3x overload spike with and without the QoS controller.

One model version serves fp32 and int8-dynamic variants of the small demo GPT.
The steady load is a fraction of the fp32 engine's measured capacity; the spike
triples it for a while. Without QoS the worker stays on fp32 and queues; with
QoS the policy engine steps it down to int8-dynamic. The figure is the client
p99 over the spike and the recovery after it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from graylane.app.bench.harness import WorkerSpec, bench_stack
from graylane.settings import Settings
from graylane.v1 import rollout_pb2

MODEL = "bench-gpt"


@dataclass(frozen=True)
class QosConfig:
    base_fraction: float = 0.5
    spike_factor: float = 3.0
    spike_s: float = 40.0
    settle_s: float = 12.0
    prompt_len: int = 96


@dataclass(frozen=True)
class SpikeRun:
    p99_ms: float
    p99_during_spike_ms: float
    steady_p99_ms: float
    slo_ms: float
    served: int
    errors: int
    variants: tuple[str, ...]


def qos_policy(slo_ms: float) -> rollout_pb2.QosPolicy:
    return rollout_pb2.QosPolicy(
        model=MODEL,
        version="v1",
        slo_p99_ms=slo_ms,
        ladder=["fp32", "int8-dynamic"],
        quality_floor="int8-dynamic",
        step_down_margin=0.2,
        step_up_ratio=0.6,
        sustain_s=2.0,
        min_dwell_s=10.0,
        enabled=True,
    )


async def run_once(
    settings: Settings,
    variants: dict[str, str],
    cfg: QosConfig,
    base_rate: float,
    with_qos: bool,
    progress: Callable[[str], None],
) -> SpikeRun:
    worker = WorkerSpec("v1", variants)
    async with bench_stack(
        settings,
        model=MODEL,
        stable="v1",
        workers=[worker],
        window_ms=4000,
        step_ms=1000,
        tag="qos",
    ) as stack:
        stack.rate, stack.prompt_len = base_rate, cfg.prompt_len
        stop = asyncio.Event()
        load = asyncio.create_task(stack.load(stop))
        await asyncio.sleep(10)
        m = stack.monitor
        steady = [s.latency_ms for s in m.history if s.ok and s.at > m.now() - 8]
        steady_p99 = float(np.percentile(steady, 99))
        slo = max(3.0 * steady_p99, 50.0)
        if with_qos:
            await stack.command(
                rollout_pb2.RolloutCommand(
                    kind=rollout_pb2.COMMAND_SET_QOS_POLICY, qos_policy=qos_policy(slo)
                )
            )
            await asyncio.sleep(3)
        progress(
            f"    steady p99 {steady_p99:.0f} ms (SLO {slo:.0f} ms); "
            f"spike x{cfg.spike_factor:.0f} for {cfg.spike_s:.0f} s"
            + (" with QoS" if with_qos else " without QoS")
        )
        spike_start = m.now()
        stack.rate = base_rate * cfg.spike_factor
        await asyncio.sleep(cfg.spike_s)
        stack.rate = base_rate
        spike_end = m.now()
        await asyncio.sleep(cfg.settle_s)
        stop.set()
        await load
        during = [s.latency_ms for s in m.history if s.ok and spike_start <= s.at <= spike_end]
        after = [
            s.latency_ms for s in m.history if s.ok and spike_end < s.at <= spike_end + cfg.settle_s
        ]
        return SpikeRun(
            p99_ms=float(np.percentile(during + after, 99)),
            p99_during_spike_ms=float(np.percentile(during, 99)),
            steady_p99_ms=steady_p99,
            slo_ms=slo,
            served=len(during) + len(after),
            errors=sum(not s.ok for s in m.history),
            variants=tuple(sorted({s.variant for s in m.history if s.at >= spike_start})),
        )


def main(cfg: QosConfig) -> int:
    from graylane.app.demo.build_versions import build_versions
    from graylane.deploy.kafka import kafka

    t0 = time.monotonic()

    def progress(text: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {text}", flush=True)

    progress("starting the broker")
    kafka.start()
    settings = Settings.from_env()
    progress("building fp32 and int8-dynamic variants of the small demo GPT")
    build_versions(settings, MODEL, {"9.0.0": 5}, size="small", progress=progress)
    from graylane.app.cli.calibrate import ensure_calibrated, registered_variants
    from graylane.capacity import measured_capacity

    files = registered_variants(settings, MODEL, "9.0.0")
    variants = {name: str(path) for name, path in files.items()}
    profile = ensure_calibrated(
        settings, MODEL, "9.0.0", files, seq_len=cfg.prompt_len, batches=(1, 8), progress=progress
    )
    # the library's figure: the fp32 variant at its best measured batch size, on this host
    capacity = measured_capacity(settings.artifact_dir, MODEL, "9.0.0", "fp32")
    if capacity is None:
        raise RuntimeError(f"no capacity for {MODEL}/9.0.0 on {profile.host}")
    base_rate = cfg.base_fraction * capacity
    progress(f"fp32 engine capacity {capacity:.0f} req/s; steady load {base_rate:.0f} req/s")
    progress("run 1: without the QoS controller")
    without = asyncio.run(run_once(settings, variants, cfg, base_rate, False, progress))
    progress(f"    p99 {without.p99_ms:.0f} ms, variants {without.variants}")
    progress("run 2: with the QoS controller")
    with_qos = asyncio.run(run_once(settings, variants, cfg, base_rate, True, progress))
    progress(f"    p99 {with_qos.p99_ms:.0f} ms, variants {with_qos.variants}")
    result: dict[str, object] = {
        "fp32_capacity_rps": round(capacity, 1),
        "capacity_host": profile.host,
        "capacity_rps_by_variant": {v.variant: round(v.rps(), 1) for v in profile.variants},
        "base_rate_rps": round(base_rate, 1),
        "spike_factor": cfg.spike_factor,
        "p99_with_qos_ms": round(with_qos.p99_ms, 1),
        "p99_without_qos_ms": round(without.p99_ms, 1),
        "ratio": round(without.p99_ms / with_qos.p99_ms, 2),
        "p99_during_spike_with_qos_ms": round(with_qos.p99_during_spike_ms, 1),
        "p99_during_spike_without_qos_ms": round(without.p99_during_spike_ms, 1),
        "variants_with_qos": list(with_qos.variants),
        "errors_with_qos": with_qos.errors,
        "errors_without_qos": without.errors,
    }
    print(json.dumps(result))
    return 0
