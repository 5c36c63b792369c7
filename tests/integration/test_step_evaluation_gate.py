"""The evaluation gate of a rollout step on the real broker, with real engines: SmolLM2 on
llama.cpp, the Q4_1 GGUF as the baseline and the Q2_K GGUF (requantized two rungs down)
as the candidate. The step to 100 % requires an evaluation; the ``graylane policy``
process sends the set over both version topics, scores the answers, and holds the
candidate, whose score drops far more than allowed; the audit carries both scores, their
intervals and the verdict, and replays to the same decisions.

The set (``smollm2-q2k-gate.jsonl``) is a subset of the project's SmolLM2 set: items the
Q4_1 rung answers right and the Q2_K rung gets wrong on this engine, measured greedy,
and a few that both answer right, so the evaluation is small and its verdict not a coin
toss (the whole set's rungs differ by 0.10, with intervals of about 0.09).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from graylane.client import GraylaneClient, Task
from graylane.evaluation.sets import load_set
from graylane.kafka.seam import KafkaFactory
from graylane.policy_engine.audit_replay import load_recorded, verify
from graylane.policy_engine.service import PolicyConfig, prepare_topics
from graylane.rollouts.spec import RolloutSpec, Step, StepEvaluation
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
SET = Path(__file__).resolve().parents[1] / "fixtures" / "smollm2-q2k-gate.jsonl"
QUESTIONS = ("Name a color.", "What day comes after Monday?", "Say hello in French.")


@contextlib.asynccontextmanager
async def steady_load(factory: KafkaFactory, rate: float) -> AsyncIterator[list[str]]:
    """Short greedy chat generations at ``rate`` a second (the gates' windows need traffic
    on both versions); the versions that answered, as they answer."""
    served: list[str] = []
    async with GraylaneClient(factory, client_id="eval-gate-load") as client:
        stop = asyncio.Event()

        async def send() -> None:
            i = 0
            while not stop.is_set():
                await client.submit(
                    MODEL,
                    task=Task.GENERATE,
                    messages=[inference_pb2.ChatMessage(role="user", content=QUESTIONS[i % 3])],
                    max_new_tokens=8,
                    routing_key=f"user-{i}",
                )
                i += 1
                await asyncio.sleep(1.0 / rate)

        async def collect() -> None:
            async for result in client.results():
                served.append(result.version)

        tasks = [asyncio.create_task(send()), asyncio.create_task(collect())]
        try:
            yield served
        finally:
            stop.set()
            tasks[1].cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_candidate_whose_evaluation_score_drops_more_than_allowed_is_held(
    settings: Settings,
    factory: KafkaFactory,
    smollm2_gguf: Path,
    smollm2_q2k_gguf: Path,
    start_llama_server: StartLlamaServer,
    tmp_path: Path,
) -> None:
    baseline = start_llama_server(smollm2_gguf, threads=1, slots=4)
    candidate = start_llama_server(smollm2_q2k_gguf, threads=1, slots=4)
    gate = StepEvaluation(str(SET), 0.02, load_set(SET).digest)
    spec = RolloutSpec(
        rollout_id="r-eval-gate",
        model=MODEL,
        baseline="v1",
        candidate="v2",
        steps=(Step(50.0, 5, 0.0), replace(Step(100.0, 0, 0.0), evaluation=gate)),
    )
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    log = tmp_path / "policy.log"
    async with running_stack(
        factory,
        model=MODEL,
        versions={},
        stable="v1",
        endpoints={"v1": [baseline.endpoint("q4_1")], "v2": [candidate.endpoint("q2_k")]},
    ):
        with policy_engine(settings, log, MODEL, "--window-ms", "12000"):
            await wait_ready(log)
            async with RoutingWatch(factory, MODEL) as watch, steady_load(factory, 2.0) as served:
                await send_command(factory, start_command(spec))
                await watch.until(lambda t: watch.weight(t, "v2") == 50.0, 60)

                async def held() -> list[audit_pb2.AuditRecord]:
                    audits = await read_audits(factory, model=MODEL, rollout_id=spec.rollout_id)
                    return [a for a in audits if a.rule == DecisionRule.EVALUATION_DROP]

                found: list[audit_pb2.AuditRecord] = []

                async def poll() -> bool:
                    found[:] = await held()
                    return bool(found)

                try:
                    await wait_until(poll, timeout=240, what="the evaluation hold", poll_s=2.0)
                except TimeoutError:
                    raise TimeoutError(log.read_text(errors="replace")[-3000:]) from None
                # Traffic kept flowing for a while after the hold: it stays where it was.
                await wait_until(lambda: len(served) >= 20, timeout=60, what="answers")
                assert not [t for _, t in watch.tables if watch.weight(t, "v2") == 100.0]
    audits = await read_audits(factory, model=MODEL, rollout_id=spec.rollout_id)
    assert not [a for a in audits if a.kind == audit_pb2.DECISION_PROMOTE]
    assert not [a for a in audits if a.kind == audit_pb2.DECISION_ROLLBACK]
    record = found[0]
    assert record.kind == audit_pb2.DECISION_HOLD
    assert record.rollout_after.candidate_weight_percent == 50.0
    ev = record.evaluation
    print("evaluation:", ev)
    assert ev.verdict == audit_pb2.EVALUATION_DROPPED and ev.set_sha256 == gate.set_sha256
    assert ev.baseline.version == "v1" and ev.candidate.version == "v2"
    items = len(load_set(SET))
    assert ev.baseline.items == ev.candidate.items == ev.paired_items == items
    assert ev.baseline.errors == ev.candidate.errors == 0
    assert ev.baseline.ci_low <= ev.baseline.mean <= ev.baseline.ci_high
    assert ev.difference < -0.02 and ev.difference_ci_high < 0.0 and ev.p_value < 0.05
    assert ev.difference == pytest.approx(ev.candidate.mean - ev.baseline.mean)
    assert {"v1", "v2"} <= set(served)
    assert verify(await load_recorded(factory, MODEL, spec.rollout_id)) == []
