"""A 10 % canary through the gateway, on the real broker: the ``user`` field is the sticky
routing key, and the policy engine judges the gateway's traffic like any other.

Router and workers (v1, v2) in process, a ``graylane policy`` process, the gateway under
uvicorn. The rollout holds at 10 % (its step needs far more samples than the test
sends, and its gates are wide, so no decision moves the table mid-test); 200
completions of 40 users go through the gateway.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import openai
import pytest

from graylane import serde
from graylane.kafka.reading import read_latest_per_key
from graylane.kafka.seam import KafkaFactory
from graylane.policy_engine.service import PolicyConfig, prepare_topics
from graylane.rollouts.spec import Gates, RolloutSpec, Step
from graylane.routing.convert import table_from_pb
from graylane.routing.table import RoutingRequest, route
from graylane.services.gateway.logic.admission import KeyRing, parse_api_keys
from graylane.settings import Settings
from graylane.v1 import rollout_pb2
from tests.support.gateway import running_gateway
from tests.support.policy import RoutingWatch, policy_engine, wait_ready
from tests.support.records import send_command, start_command
from tests.support.stack import running_stack, wait_for_table
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MODEL = "gpt"
KEY = "team-d-0123456789abcdef"
USERS = 40
REQUESTS = 200
RATE = 10.0
"""Requests/s: each user calls about once per policy window (4 s)."""


def _spec() -> RolloutSpec:
    return RolloutSpec(
        rollout_id="r-gateway",
        model=MODEL,
        baseline="v1",
        candidate="v2",
        steps=(Step(10.0, 1_000_000, 3600.0), Step(100.0, 0, 0.0)),
        gates=Gates(max_p99_ratio=100.0, p99_floor_ms=1000.0, max_slow_ratio=100.0),
        failures_to_rollback=1000,
    )


async def _rollout_state(factory: KafkaFactory) -> rollout_pb2.RolloutState | None:
    states = await read_latest_per_key(factory, factory.layout.rollouts())
    raw = states.get(b"r-gateway")
    return None if raw is None else serde.decode(rollout_pb2.RolloutState, raw)


async def test_a_10_percent_canary_through_the_gateway_keeps_each_user_on_one_version(
    settings: Settings, factory: KafkaFactory, models: dict[str, Path], tmp_path: Path
) -> None:
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    log = tmp_path / "policy.log"
    served: dict[str, list[str]] = {}
    async with (
        running_stack(factory, model=MODEL, versions=models, stable="v1") as stack,
        running_gateway(factory, keys=KeyRing(parse_api_keys(f"{KEY}:infer:team-d"))) as gateway,
        openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=KEY, max_retries=0) as client,
    ):
        with policy_engine(settings, log, MODEL):
            await wait_ready(log)
            async with RoutingWatch(factory, MODEL) as watch:
                await send_command(factory, start_command(_spec()))
                _, canary = await watch.until(lambda t: watch.weight(t, "v2") == 10.0, 30)
                await wait_for_table(stack, MODEL, canary.epoch)
                started = time.monotonic()
                for i in range(REQUESTS):
                    await asyncio.sleep(max(0.0, started + i / RATE - time.monotonic()))
                    user = f"user-{i % USERS}"
                    answer = await client.completions.create(
                        model=MODEL, prompt="hello", max_tokens=1, temperature=0, user=user
                    )
                    served.setdefault(user, []).append(answer.system_fingerprint or "")

                async def judged() -> bool:
                    state = await _rollout_state(factory)
                    return state is not None and state.evidence.candidate_requests > 0

                await wait_until(judged, timeout=30, what="the rollout counted candidate requests")
                state = await _rollout_state(factory)
                tables = [t for _, t in watch.tables if t.epoch >= canary.epoch]

    assert state is not None
    assert state.phase == rollout_pb2.PROGRESSING
    assert [watch.weight(t, "v2") for t in tables] == [10.0]  # one table throughout
    table = table_from_pb(canary)
    for user, versions in served.items():
        assert len(set(versions)) == 1, (user, versions)  # sticky
        expected = route(table, RoutingRequest(request_id="any", routing_key=user)).version
        assert versions[0] == f"graylane:{expected}", user  # the bucket of its user
    per_version = Counter(v[0] for v in served.values())
    on_canary = per_version["graylane:v2"]
    assert 0 < on_canary < USERS // 4, per_version  # about a tenth of the users
    calls = Counter(v for versions in served.values() for v in versions)
    assert sum(calls.values()) == REQUESTS
    # The policy engine counted the gateway's requests (no other traffic reached v2 or v1).
    evidence = state.evidence
    assert 0 < evidence.candidate_requests <= calls["graylane:v2"]
    assert 0 < evidence.baseline_requests <= calls["graylane:v1"]
    assert evidence.candidate_errors == 0 and evidence.baseline_errors == 0
