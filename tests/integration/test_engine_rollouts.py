"""Rollouts and QoS between versions served by real engine servers (llama.cpp's
``llama-server`` on SmolLM2-135M-Instruct), judged by a ``graylane policy`` process on the
real broker, from the workers' own TTFT/TPOT stamps.

- A canary whose engine is slower per token is rolled back on ``tpot_sequential``: the
  baseline serves the Q4_0 GGUF, the candidate the Q4_1 one (on this CPU ggml repacks
  Q4_0 for its AVX2 kernels, not Q4_1: 1.4-1.8x slower per token, measured, not faked).
- A healthy canary (the same engine and model) is promoted.
- Under a load spike, QoS steps a version down to its lower-precision endpoint (Q4_1 ->
  Q4_0, on waiting sequences over its limit) and back up once the load is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from graylane.client import GraylaneClient, Result, Task
from graylane.engine.server import EngineEndpoint
from graylane.kafka.seam import KafkaFactory
from graylane.policy_engine.audit_replay import load_recorded, verify
from graylane.policy_engine.service import PolicyConfig, prepare_topics
from graylane.rollouts.spec import RolloutSpec, Step
from graylane.rollouts.vocabulary import DecisionRule
from graylane.settings import Settings
from graylane.v1 import audit_pb2, control_pb2, inference_pb2, rollout_pb2
from tests.support.llamacpp import StartLlamaServer
from tests.support.policy import RoutingWatch, policy_engine, wait_ready
from tests.support.records import qos_command, read_audits, send_command, start_command
from tests.support.stack import running_stack
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.speed]

MODEL = "smollm2"
NEW_TOKENS = 24
RATE = 4.0
"""Generations a second in the rollouts: about half of what two engines of one thread
each carry here (the slower candidate's share included)."""
QUESTIONS = (
    "What is the capital of France? Answer in one word.",
    "Name a color.",
    "What is 3 plus 4?",
    "Say hello in French.",
    "Name an animal that lives in the sea.",
    "What day comes after Monday?",
)


@contextlib.asynccontextmanager
async def chat_load(
    factory: KafkaFactory, rate: float
) -> AsyncIterator[tuple[list[Result], list[float]]]:
    """Greedy chat generations at ``rate`` per second (changeable through the second list's
    one element), answers collected as they arrive."""
    results: list[Result] = []
    rates = [rate]
    async with GraylaneClient(factory, client_id="engine-rollout-load") as client:
        stop = asyncio.Event()

        async def send() -> None:
            i = 0
            while not stop.is_set():
                question = QUESTIONS[i % len(QUESTIONS)]
                await client.submit(
                    MODEL,
                    task=Task.GENERATE,
                    messages=[inference_pb2.ChatMessage(role="user", content=question)],
                    max_new_tokens=NEW_TOKENS,
                    routing_key=f"user-{i}",
                )
                i += 1
                await asyncio.sleep(1.0 / rates[0])

        async def collect() -> None:
            async for result in client.results():
                results.append(result)

        tasks = [asyncio.create_task(send()), asyncio.create_task(collect())]
        try:
            yield results, rates
        finally:
            stop.set()
            tasks[1].cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def tpot_ms(results: list[Result], version: str) -> float:
    mine = [r.timing.tpot_ms for r in results if r.version == version and r.ok and r.timing.tpot_ms]
    assert len(mine) >= 10, f"{len(mine)} timed answers from {version}"
    return statistics.median(mine)


async def _rollout(
    settings: Settings,
    factory: KafkaFactory,
    tmp_path: Path,
    endpoints: dict[str, EngineEndpoint],
    spec: RolloutSpec,
    until_weight: float,
) -> tuple[list[Result], control_pb2.RoutingTable, list[audit_pb2.AuditRecord]]:
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    async with running_stack(
        factory,
        model=MODEL,
        versions={},
        stable="v1",
        endpoints={version: [endpoint] for version, endpoint in endpoints.items()},
    ):
        # A window long enough to hold the 20 baseline generations a TPOT threshold needs,
        # at the rate two one-thread engines carry here.
        with policy_engine(settings, tmp_path / "policy.log", MODEL, "--window-ms", "12000"):
            await wait_ready(tmp_path / "policy.log")
            async with (
                RoutingWatch(factory, MODEL) as watch,
                chat_load(factory, RATE) as (results, _),
            ):
                await send_command(factory, start_command(spec))
                await watch.until(lambda t: watch.weight(t, "v2") > 0, 60)
                try:
                    _, table = await watch.until(
                        lambda t: watch.weight(t, "v2") == until_weight and t.epoch > 1, 240
                    )
                finally:
                    ok = [r for r in results if r.ok]
                    print(
                        f"{len(results)} answers, {len(ok)} ok, by version",
                        {v: sum(1 for r in ok if r.version == v) for v in ("v1", "v2")},
                    )
    audits = await read_audits(factory, model=MODEL, rollout_id=spec.rollout_id)
    return results, table, audits


async def test_a_candidate_engine_slower_per_token_is_rolled_back_on_tpot(
    settings: Settings,
    factory: KafkaFactory,
    smollm2_gguf: Path,
    smollm2_q4_0_gguf: Path,
    start_llama_server: StartLlamaServer,
    tmp_path: Path,
) -> None:
    baseline = start_llama_server(smollm2_q4_0_gguf, threads=1, slots=4)
    candidate = start_llama_server(smollm2_gguf, threads=1, slots=4)
    spec = RolloutSpec(
        rollout_id="r-engine-tpot",
        model=MODEL,
        baseline="v1",
        candidate="v2",
        steps=(Step(50.0, 20, 900.0), Step(100.0, 0, 0.0)),  # only a verdict ends it
    )
    endpoints = {"v1": baseline.endpoint("q4_0"), "v2": candidate.endpoint("q4_1")}
    results, table, audits = await _rollout(
        settings, factory, tmp_path, endpoints, spec, until_weight=0.0
    )
    assert table.stable_version == "v1"
    base, cand = tpot_ms(results, "v1"), tpot_ms(results, "v2")
    print(f"engine TPOT: baseline {base:.1f} ms, candidate {cand:.1f} ms")
    assert cand > 1.15 * base, (base, cand)  # the candidate's engine really is slower
    rollbacks = [a for a in audits if a.kind == audit_pb2.DECISION_ROLLBACK]
    assert [a.rule for a in rollbacks] == [DecisionRule.TPOT_SEQUENTIAL.value], [
        (a.rule, a.reason[:200]) for a in audits
    ]
    assert verify(await load_recorded(factory, MODEL, spec.rollout_id)) == []
    texts = [r.text for r in results if r.ok]
    assert any("Paris" in t for t in texts)  # real answers


async def test_a_healthy_candidate_engine_is_promoted(
    settings: Settings,
    factory: KafkaFactory,
    smollm2_q4_0_gguf: Path,
    start_llama_server: StartLlamaServer,
    tmp_path: Path,
) -> None:
    baseline = start_llama_server(smollm2_q4_0_gguf, threads=1, slots=4)
    candidate = start_llama_server(smollm2_q4_0_gguf, threads=1, slots=4)
    spec = RolloutSpec(
        rollout_id="r-engine-healthy",
        model=MODEL,
        baseline="v1",
        candidate="v2",
        steps=(Step(50.0, 30, 10.0), Step(100.0, 0, 0.0)),
    )
    endpoints = {"v1": baseline.endpoint("q4_0"), "v2": candidate.endpoint("q4_0")}
    results, table, audits = await _rollout(
        settings, factory, tmp_path, endpoints, spec, until_weight=100.0
    )
    assert table.stable_version == "v2"
    assert not [a for a in audits if a.kind == audit_pb2.DECISION_ROLLBACK]
    assert [a for a in audits if a.kind == audit_pb2.DECISION_PROMOTE]
    assert {r.version for r in results if r.ok} == {"v1", "v2"}


async def test_under_a_load_spike_qos_steps_to_the_lower_endpoint_and_back(
    settings: Settings,
    factory: KafkaFactory,
    smollm2_gguf: Path,
    smollm2_q4_0_gguf: Path,
    start_llama_server: StartLlamaServer,
    tmp_path: Path,
) -> None:
    upper = start_llama_server(smollm2_gguf, threads=1, slots=2)
    lower = start_llama_server(smollm2_q4_0_gguf, threads=1, slots=2)
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    policy = rollout_pb2.QosPolicy(
        model=MODEL,
        version="v1",
        slo_ttft_p99_ms=20_000.0,  # generative; the waiting sequences are what breach here
        slo_p99_ms=0.0,
        max_waiting_sequences=4,
        ladder=["q4_1", "q4_0"],
        quality_floor="q4_0",
        sustain_s=2.0,
        min_dwell_s=8.0,
        enabled=True,
        # generations per second one endpoint carries (2 slots, ~24 tokens each): back up
        # once the load is below 0.7 x that of the rung above
        rung_capacity_rps={"q4_1": 3.0, "q4_0": 5.0},
        up_capacity_fraction=0.7,
    )
    async with running_stack(
        factory,
        model=MODEL,
        versions={},
        stable="v1",
        endpoints={"v1": [upper.endpoint("q4_1"), lower.endpoint("q4_0")]},
    ) as stack:
        worker = stack.workers["v1"]
        with policy_engine(settings, tmp_path / "policy.log", MODEL):
            await wait_ready(tmp_path / "policy.log")
            await send_command(factory, qos_command(policy))
            async with chat_load(factory, 1.0) as (results, rates):
                await wait_until(lambda: len(results) >= 5, timeout=60, what="answers")
                assert worker.active_variant == "q4_1"
                rates[0] = 8.0  # the spike: far more than two slots decode
                await wait_until(
                    lambda: worker.active_variant == "q4_0", timeout=120, what="step down"
                )
                rates[0] = 0.5  # the spike is over
                await wait_until(
                    lambda: worker.active_variant == "q4_1", timeout=180, what="step back up"
                )
    audits = await read_audits(factory, model=MODEL)
    steps = [a.reason[:160] for a in audits if a.kind == audit_pb2.DECISION_PRECISION_CHANGE]
    assert len(steps) >= 2, steps
    served = {r.variant for r in results if r.ok}
    assert served == {"q4_1", "q4_0"}, served  # answers came from both endpoints
    assert all(r.text.strip() for r in results if r.ok)
