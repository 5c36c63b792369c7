"""Generation rollouts judged on TTFT and TPOT, on the real broker with the real ONNX
Runtime decoder (continuous batching) and a `graylane policy` process.

The versions decode the same tiny KV-cache GPT; what differs is real: the engine's
speed per decode step (the worker's decode-step latency fault, slept on the engine
thread) and where answers end (a version whose tokenizer names an end-of-sequence
token that greedy decoding reaches after a few tokens answers shorter). Nothing is
faked: telemetry, TTFT and TPOT come from the workers' own stamps.

- A candidate 1.5x slower per token but answering much shorter (whole-request latency
  better than the baseline's) is rolled back on ``tpot_sequential``.
- A candidate that only answers longer (same per-token speed, whole requests several
  times slower) is never rolled back: it is held on ``output_length_drift``.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from graylane.client import GraylaneClient, Result, Task
from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine_worker.faults import FaultInjection
from graylane.engine_worker.kv_decode import generate_with_cache
from graylane.engine_worker.requests import DemoByteTokenizer
from graylane.kafka.seam import KafkaFactory
from graylane.models.demo_gpt import write_demo_gpt
from graylane.policy_engine.audit_replay import load_recorded, verify
from graylane.policy_engine.service import PolicyConfig, prepare_topics
from graylane.rollouts.spec import RolloutSpec, Step
from graylane.rollouts.vocabulary import DecisionRule
from graylane.settings import Settings
from graylane.v1 import audit_pb2
from tests.support.policy import RoutingWatch, policy_engine, wait_ready
from tests.support.records import read_audits, send_command, start_command
from tests.support.stack import running_stack
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MODEL = "lgpt"
NEW_TOKENS = 64
CALL_MS = 5.0
"""Every engine call (prefill and decode) of both versions takes this much longer."""
STEP_MS = 15.0
"""The baseline's extra per decode step: its time per token is about 20 ms."""
SLOW_STEP_MS = 25.0
"""The slow candidate's: about 30 ms per token, 1.5x the baseline's."""
RPS = 16.0


class EosTokenizer(DemoByteTokenizer):
    """The demo byte vocabulary with a version's own end-of-sequence token."""

    def __init__(self, eos: int) -> None:
        self._eos = eos

    @property
    def eos_id(self) -> int | None:
        return self._eos


@dataclass(frozen=True)
class ShortAnswers:
    eos: int
    """A token greedy decoding reaches early: as a version's EOS, its answers are short."""
    prompts: tuple[tuple[int, ...], ...]
    """Prompts that reach ``eos`` after 2..10 tokens (and 64 tokens without it)."""


@pytest.fixture(scope="module")
def kv_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_gpt(tmp_path_factory.mktemp("kv") / "kv.onnx", "tiny", seed=5, kv_cache=True)


@pytest.fixture(scope="module")
def short(kv_model: Path) -> ShortAnswers:
    """Measured on the model: the token that ends most greedy answers early, and the
    prompts it ends early."""
    engine = OnnxRuntimeEngine.load(kv_model, "fp32", intra_op_threads=1)
    pool = [(1, 2, 3, i) for i in range(200)]
    answers = [r.tokens for r in generate_with_cache(engine, pool, NEW_TOKENS, None, 256)]
    engine.close()

    def ends_early(tokens: tuple[int, ...], t: int) -> bool:
        return t in tokens and 2 <= tokens.index(t) <= 10

    vocab = {t for a in answers for t in a}
    eos = max(sorted(vocab), key=lambda t: sum(ends_early(a, t) for a in answers))
    prompts = tuple(p for p, a in zip(pool, answers, strict=True) if ends_early(a, eos))
    assert len(prompts) >= 10, f"only {len(prompts)} prompts end early on {eos}"
    return ShortAnswers(eos, prompts)


@contextlib.asynccontextmanager
async def generation_load(
    factory: KafkaFactory, prompts: tuple[tuple[int, ...], ...]
) -> AsyncIterator[list[Result]]:
    """Greedy generations at RPS, answers collected as they arrive."""
    results: list[Result] = []
    async with GraylaneClient(factory, client_id="gen-load") as client:
        stop = asyncio.Event()

        async def send() -> None:
            i = 0
            while not stop.is_set():
                await client.submit(
                    MODEL,
                    token_ids=list(prompts[i % len(prompts)]),
                    task=Task.GENERATE,
                    max_new_tokens=NEW_TOKENS,
                    routing_key=f"user-{i}",
                )
                i += 1
                await asyncio.sleep(1.0 / RPS)

        async def collect() -> None:
            async for result in client.results():
                results.append(result)

        tasks = [asyncio.create_task(send()), asyncio.create_task(collect())]
        try:
            yield results
        finally:
            stop.set()
            tasks[1].cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def spec_of(rollout_id: str) -> RolloutSpec:
    # Half the traffic at once, and a dwell no run reaches: only a verdict ends it.
    return RolloutSpec(
        rollout_id=rollout_id,
        model=MODEL,
        baseline="v1",
        candidate="v2",
        steps=(Step(50.0, 40, 600.0), Step(100.0, 0, 0.0)),
    )


@dataclass(frozen=True)
class Measured:
    """A version's answers as the worker stamped them (its own clock, no test timing)."""

    tpot_ms: float
    """Median time per output token."""
    decode_ms: float
    """Median time from an answer's first token to its last: its tokens after the first
    times their time per token (the whole request less its queue wait and prefill)."""
    tokens: float


def measured(results: list[Result], version: str) -> Measured:
    mine = [r for r in results if r.version == version and r.ok and r.usage is not None]
    assert len(mine) >= 20, f"{len(mine)} answers from {version}"
    timed = [r for r in mine if r.timing.tpot_ms > 0 and r.usage is not None]
    return Measured(
        tpot_ms=statistics.median(r.timing.tpot_ms for r in timed),
        decode_ms=statistics.median(
            r.timing.tpot_ms * (r.usage.completion_tokens - 1) for r in timed if r.usage
        ),
        tokens=statistics.mean(r.usage.completion_tokens for r in mine if r.usage is not None),
    )


def slept_per_token_ms(step_ms: float) -> float:
    """The least time per output token a worker can stamp when each decode step sleeps
    ``step_ms`` plus ``CALL_MS`` (less one millisecond of stamp rounding): a floor that
    holds however loaded the machine is, where a ratio of two measured times does not."""
    return step_ms + CALL_MS - 1.0


async def _rollout_audits(factory: KafkaFactory, rollout_id: str) -> list[audit_pb2.AuditRecord]:
    return await read_audits(factory, model=MODEL, rollout_id=rollout_id)


async def test_a_candidate_slower_per_token_is_rolled_back_on_tpot_though_it_answers_faster(
    settings: Settings, factory: KafkaFactory, kv_model: Path, short: ShortAnswers, tmp_path: Path
) -> None:
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    faults = {
        "v1": FaultInjection(extra_latency_ms=CALL_MS, decode_step_latency_ms=STEP_MS),
        # 1.5x the baseline's time per decode step; its answers end on EOS after a few.
        "v2": FaultInjection(extra_latency_ms=CALL_MS, decode_step_latency_ms=SLOW_STEP_MS),
    }
    async with running_stack(
        factory,
        model=MODEL,
        versions={"v1": kv_model, "v2": kv_model},
        stable="v1",
        faults=faults,
        tokenizers={"v2": EosTokenizer(short.eos)},
        max_batch_size=16,
    ):
        with policy_engine(settings, tmp_path / "policy.log", MODEL):
            await wait_ready(tmp_path / "policy.log")
            async with (
                RoutingWatch(factory, MODEL) as watch,
                generation_load(factory, short.prompts) as results,
            ):
                await send_command(factory, start_command(spec_of("r-tpot")))
                await watch.until(lambda t: watch.weight(t, "v2") > 0, 30)
                _, table = await watch.until(
                    lambda t: watch.weight(t, "v2") == 0.0 and t.epoch > 1, 90
                )
    assert table.stable_version == "v1"
    base, cand = measured(results, "v1"), measured(results, "v2")
    print(f"TPOT rollback: baseline {base}, candidate {cand}")
    # The slowdown is real and per token: every candidate token took at least its slower
    # step, by the worker's own stamps (the machine adds to both sides, so a measured
    # ratio is no claim). The candidate's answers are a fraction of the baseline's
    # tokens, and so of its decoding time: whole requests are faster.
    assert base.tpot_ms >= slept_per_token_ms(STEP_MS), base
    assert cand.tpot_ms >= slept_per_token_ms(SLOW_STEP_MS), cand
    assert cand.tokens < base.tokens / 3 and cand.decode_ms < base.decode_ms, (base, cand)
    audits = await _rollout_audits(factory, "r-tpot")
    rollbacks = [a for a in audits if a.kind == audit_pb2.DECISION_ROLLBACK]
    assert [a.rule for a in rollbacks] == [DecisionRule.TPOT_SEQUENTIAL.value], [
        (a.rule, a.reason[:200]) for a in audits
    ]
    # The generation windows are on record: the decisions replay the same.
    assert verify(await load_recorded(factory, MODEL, "r-tpot")) == []


async def test_a_candidate_that_only_answers_longer_is_held_on_length_drift_not_rolled_back(
    settings: Settings, factory: KafkaFactory, kv_model: Path, short: ShortAnswers, tmp_path: Path
) -> None:
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    same_speed = FaultInjection(extra_latency_ms=CALL_MS, decode_step_latency_ms=STEP_MS)
    async with running_stack(
        factory,
        model=MODEL,
        versions={"v1": kv_model, "v2": kv_model},
        stable="v1",
        faults={"v1": same_speed, "v2": same_speed},
        # The baseline ends its answers on EOS after a few tokens; the candidate does not.
        tokenizers={"v1": EosTokenizer(short.eos)},
        max_batch_size=16,
    ):
        with policy_engine(settings, tmp_path / "policy.log", MODEL):
            await wait_ready(tmp_path / "policy.log")
            async with (
                RoutingWatch(factory, MODEL) as watch,
                generation_load(factory, short.prompts) as results,
            ):
                await send_command(factory, start_command(spec_of("r-long")))
                await watch.until(lambda t: watch.weight(t, "v2") > 0, 30)
                held: list[audit_pb2.AuditRecord] = []

                async def drift_holds() -> bool:
                    audits = await _rollout_audits(factory, "r-long")
                    held[:] = [
                        a
                        for a in audits
                        if a.rule == DecisionRule.OUTPUT_LENGTH_DRIFT.value
                        and a.kind == audit_pb2.DECISION_HOLD
                    ]
                    return len(held) >= 10  # ten evaluations, one a second

                try:
                    await wait_until(drift_holds, timeout=90, poll_s=1.0)
                finally:
                    audits = await _rollout_audits(factory, "r-long")
                    print([(a.kind, a.rule, a.reason[:160]) for a in audits][-2:])
    assert watch.weight(watch.tables[-1][1], "v2") == 50.0, watch.tables
    assert not [a for a in audits if a.kind == audit_pb2.DECISION_ROLLBACK]
    # The judged timings held while whole requests got several times slower.
    gated = [a for a in audits if a.kind == audit_pb2.DECISION_GATE_FAILED]
    assert not gated, [(a.rule, a.reason[:200]) for a in gated]
    base, cand = measured(results, "v1"), measured(results, "v2")
    print(f"longer answers held: baseline {base}, candidate {cand}; {len(held)} drift holds")
    # Same per-token floor on both sides (what the policy engine judged alike: no TPOT
    # gate failed above); the candidate's answers hold several times the tokens, and so
    # several times the decoding, by the worker's stamps.
    for side in (base, cand):
        assert side.tpot_ms >= slept_per_token_ms(STEP_MS), (base, cand)
    assert cand.tokens > 3 * base.tokens and cand.decode_ms > 3 * base.decode_ms, (base, cand)
    assert "drift: output tokens mean" in held[-1].reason
