"""Shadow agreement on text, on the real broker with real engines: SmolLM2 on llama.cpp,
every request shadowed, answers sampled (temperature 0.3, no seed: each version draws its
own), judged by a ``graylane policy`` process.

- A candidate of the same model (the same Q4_1 GGUF, drawing with other seeds) is not
  called a regression: its texts are as alike to the baseline's as the baseline's are to
  each other, and the shadow phase ends with the advance to the first canary step.
- A candidate two precision rungs down (the Q2_K GGUF) answers otherwise: the
  anytime-valid test on text similarity rejects (rule ``text_agreement``), and it never
  gets live traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from graylane.client import GraylaneClient, Task
from graylane.engine.server import EngineEndpoint
from graylane.kafka.seam import KafkaFactory
from graylane.policy_engine.audit_replay import load_recorded, verify
from graylane.policy_engine.service import PolicyConfig, prepare_topics
from graylane.rollouts.spec import RolloutSpec, Step, Strategy
from graylane.rollouts.vocabulary import DecisionRule
from graylane.settings import Settings
from graylane.v1 import audit_pb2, inference_pb2
from tests.support.llamacpp import StartLlamaServer
from tests.support.policy import RoutingWatch, policy_engine, wait_ready
from tests.support.records import read_audits, send_command, start_command
from tests.support.stack import running_stack
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MODEL = "smollm2"
QUESTIONS = (
    "What is the capital of France?",
    "Name a color and say why you like it.",
    "Say hello in French.",
    "What is 3 plus 4?",
)
"""Few, so that each recurs: a pair is scored against the baseline's earlier answer to the
same question."""


@contextlib.asynccontextmanager
async def sampled_load(factory: KafkaFactory, rate: float) -> AsyncIterator[list[str]]:
    """Sampled chat generations without a seed at ``rate`` a second; the answers' texts."""
    texts: list[str] = []
    async with GraylaneClient(factory, client_id="text-agreement-load") as client:
        stop = asyncio.Event()

        async def send() -> None:
            i = 0
            while not stop.is_set():
                question = QUESTIONS[i % len(QUESTIONS)]
                await client.submit(
                    MODEL,
                    task=Task.GENERATE,
                    messages=[inference_pb2.ChatMessage(role="user", content=question)],
                    max_new_tokens=24,
                    temperature=0.3,
                    routing_key=f"user-{i}",
                )
                i += 1
                await asyncio.sleep(1.0 / rate)

        async def collect() -> None:
            async for result in client.results():
                if result.ok:
                    texts.append(result.text)

        tasks = [asyncio.create_task(send()), asyncio.create_task(collect())]
        try:
            yield texts
        finally:
            stop.set()
            tasks[1].cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _shadow(
    settings: Settings,
    factory: KafkaFactory,
    tmp_path: Path,
    endpoints: dict[str, EngineEndpoint],
    spec: RolloutSpec,
    until: DecisionRule,
    wait_s: float,
) -> list[audit_pb2.AuditRecord]:
    """Run the shadow rollout until an audit record of rule ``until``; every audit record."""
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    log = tmp_path / "policy.log"
    async with running_stack(
        factory,
        model=MODEL,
        versions={},
        stable="v1",
        endpoints={version: [endpoint] for version, endpoint in endpoints.items()},
    ):
        with policy_engine(settings, log, MODEL, "--window-ms", "12000"):
            await wait_ready(log)
            async with RoutingWatch(factory, MODEL), sampled_load(factory, 2.0) as texts:
                await send_command(factory, start_command(spec))
                found: list[audit_pb2.AuditRecord] = []
                last: list[audit_pb2.AuditRecord] = []

                async def decided() -> bool:
                    audits = await read_audits(factory, model=MODEL, rollout_id=spec.rollout_id)
                    found[:] = [a for a in audits if a.rule == until]
                    last[:] = audits[-1:]
                    return bool(found)

                try:
                    await wait_until(decided, timeout=wait_s, what=str(until), poll_s=3.0)
                except TimeoutError:
                    seen = [(a.rule, str(a.agreement)) for a in last]
                    raise TimeoutError(
                        f"{seen}\n{log.read_text(errors='replace')[-2000:]}"
                    ) from None
                assert len(set(texts)) > len(QUESTIONS)  # sampled: the answers vary
    return await read_audits(factory, model=MODEL, rollout_id=spec.rollout_id)


def _spec(rollout_id: str, shadow_pairs: int) -> RolloutSpec:
    return RolloutSpec(
        rollout_id=rollout_id,
        model=MODEL,
        baseline="v1",
        candidate="v2",
        strategy=Strategy.SHADOW_THEN_CANARY,
        shadow_share=1.0,
        shadow_duration_s=20.0,
        steps=(Step(50.0, shadow_pairs, 0.0), Step(100.0, 0, 0.0)),
    )


async def test_the_same_model_drawing_other_seeds_passes_its_shadow(
    settings: Settings,
    factory: KafkaFactory,
    smollm2_gguf: Path,
    start_llama_server: StartLlamaServer,
    tmp_path: Path,
) -> None:
    server = start_llama_server(smollm2_gguf, threads=1, slots=4)
    spec = _spec("r-text-same", 40)
    endpoints = {"v1": server.endpoint("q4_1"), "v2": server.endpoint("q4_1")}
    audits = await _shadow(
        settings, factory, tmp_path, endpoints, spec, DecisionRule.ALL_GATES_PASSED, 180
    )
    advance = next(a for a in audits if a.rule == DecisionRule.ALL_GATES_PASSED)
    assert advance.kind == audit_pb2.DECISION_ADVANCE
    text = advance.agreement
    print("same model:", text)
    assert text.text_pairs >= 40 - text.pairs and text.unseeded_pairs > 0
    assert text.text_similarity > text.text_self_similarity - 0.1
    assert not [a for a in audits if a.rule == DecisionRule.TEXT_AGREEMENT]
    assert verify(await load_recorded(factory, MODEL, spec.rollout_id)) == []


@pytest.mark.timeout(600)
async def test_a_lower_rung_answering_otherwise_is_caught(
    settings: Settings,
    factory: KafkaFactory,
    smollm2_gguf: Path,
    smollm2_q2k_gguf: Path,
    start_llama_server: StartLlamaServer,
    tmp_path: Path,
) -> None:
    baseline = start_llama_server(smollm2_gguf, threads=1, slots=4)
    candidate = start_llama_server(smollm2_q2k_gguf, threads=1, slots=4)
    spec = _spec("r-text-rung", 10_000)  # only a verdict ends the shadow
    endpoints = {"v1": baseline.endpoint("q4_1"), "v2": candidate.endpoint("q2_k")}
    audits = await _shadow(
        settings, factory, tmp_path, endpoints, spec, DecisionRule.TEXT_AGREEMENT, 420
    )
    failed = next(a for a in audits if a.rule == DecisionRule.TEXT_AGREEMENT)
    print("lower rung:", failed.agreement, failed.reason[:300])
    assert failed.kind in (audit_pb2.DECISION_GATE_FAILED, audit_pb2.DECISION_ROLLBACK)
    assert failed.agreement.text_similarity < failed.agreement.text_self_similarity
    assert not [a for a in audits if a.kind == audit_pb2.DECISION_ADVANCE]
    assert verify(await load_recorded(factory, MODEL, spec.rollout_id)) == []
