"""A/B on user outcomes, on the real broker: completions through the gateway, a synthetic
rater through ``POST /v1/feedback``, the policy engine's verdict in the audit.

Router and workers (v1, v2: the tiny demo GPT) in process, a ``graylane policy``
process, the gateway under uvicorn; an ``AB_SPLIT`` rollout at 50 % whose latency and
error gates are wide (guardrails that do not trip here), so the outcome test decides.
The rater (tenant alice) rates every answer it is given by the version that served it
(``x-graylane-version``), with a fixed pattern of thumbs down per version; tenant bob
tries to rate alice's answers.

- 5 points worse (v1 rated up 100 %, v2 95 %): the candidate loses (rolled back, rule
  ``outcome_worse``), and the audit's evidence counts exactly the ratings taken.
- Equal (both 95 %): no winner; the hold reaches its horizon and ends as "no
  difference". The statistics of this case over many seeds are the unit tests'
  (``tests/unit/test_policy_outcomes.py``, 400 seeds).
- Bob's ratings of alice's answers are answered 404 and never reach the outcomes topic;
  a second rating by alice is answered 409 and counted once.

A tenth of the answers are streamed: they are rated by the id of their chunks and
joined by the version their last chunk names, like the others.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from graylane import serde
from graylane.kafka.reading import read_latest_per_key, read_to_end
from graylane.kafka.seam import KafkaFactory
from graylane.policy_engine.service import PolicyConfig, prepare_topics
from graylane.rollouts.spec import Gates, RolloutSpec, Step, Strategy
from graylane.services.gateway.logic.admission import KeyRing, parse_api_keys
from graylane.settings import Settings
from graylane.v1 import audit_pb2, outcome_pb2, rollout_pb2
from tests.support.gateway import running_gateway
from tests.support.policy import RoutingWatch, policy_engine, wait_ready
from tests.support.records import read_audits, send_command, start_command
from tests.support.stack import running_stack, wait_for_table

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MODEL = "gpt"
ALICE = "alice-key-0123456789abcdef"
BOB = "bob-key-0123456789abcdef0"
CONCURRENCY = 16
MAX_CALLS = 4000
"""A bound on the test, far above what a verdict needs (about 500 ratings at 5 points)."""


def _spec(rollout_id: str, horizon_s: float) -> RolloutSpec:
    return RolloutSpec(
        rollout_id=rollout_id,
        model=MODEL,
        baseline="v1",
        candidate="v2",
        strategy=Strategy.AB_SPLIT,
        ab_weight_percent=50.0,
        ab_duration_s=horizon_s,
        steps=(Step(50.0, 10, 0.0),),
        gates=Gates(max_p99_ratio=100.0, p99_floor_ms=1000.0, max_slow_ratio=100.0),
        failures_to_rollback=1000,
    )


@dataclass
class Rater:
    """Rates the n-th answer of a version down when ``n % every == every - 1`` (0: never)."""

    down_every: dict[str, int]
    rated: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    bob: Counter[int] = field(default_factory=Counter)

    def rating(self, version: str) -> str:
        n, every = self.rated[version], self.down_every[version]
        self.rated[version] += 1
        return "down" if every and n % every == every - 1 else "up"


async def _state(factory: KafkaFactory, rollout_id: str) -> rollout_pb2.RolloutState | None:
    raw = (await read_latest_per_key(factory, factory.layout.rollouts())).get(rollout_id.encode())
    return None if raw is None else serde.decode(rollout_pb2.RolloutState, raw)


async def _outcomes(factory: KafkaFactory) -> list[outcome_pb2.Outcome]:
    records = await read_to_end(factory, factory.layout.outcomes(), client_suffix="test-outcomes")
    return [serde.decode(outcome_pb2.Outcome, r.value) for r in records if r.value]


async def _ab(
    settings: Settings,
    factory: KafkaFactory,
    models: dict[str, Path],
    log: Path,
    spec: RolloutSpec,
    rater: Rater,
) -> rollout_pb2.RolloutState:
    """Run the rollout under rated load until it ends; its last state."""
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    # Alice calls and rates as fast as the stack answers: her key's bucket has room for it.
    keys = KeyRing(parse_api_keys(f"{ALICE}:infer:alice:10000:1000,{BOB}:infer:bob"))
    alice = {"Authorization": f"Bearer {ALICE}"}
    bob = {"Authorization": f"Bearer {BOB}"}
    async with (
        running_stack(factory, model=MODEL, versions=models, stable="v1") as stack,
        running_gateway(factory, keys=keys) as gateway,
        httpx.AsyncClient(base_url=gateway.url, timeout=30.0) as http,
    ):
        with policy_engine(settings, log, MODEL):
            await wait_ready(log)
            async with RoutingWatch(factory, MODEL) as watch:
                await send_command(factory, start_command(spec))
                _, split = await watch.until(lambda t: watch.weight(t, "v2") == 50.0, 30)
                await wait_for_table(stack, MODEL, split.epoch)

                def ended() -> bool:
                    return any(t.epoch > split.epoch for _, t in watch.tables)

                async def streamed(body: dict[str, object]) -> tuple[str, str]:
                    """The id and the served version of a streamed answer (its last chunk's
                    ``system_fingerprint``)."""
                    ids, versions = set(), set()
                    async with http.stream(
                        "POST", "/v1/completions", json={**body, "stream": True}, headers=alice
                    ) as answer:
                        assert answer.status_code == 200
                        async for line in answer.aiter_lines():
                            if line.startswith("data: {"):
                                chunk = json.loads(line.removeprefix("data: "))
                                ids.add(chunk["id"])
                                if chunk.get("system_fingerprint"):
                                    versions.add(chunk["system_fingerprint"])
                    assert len(ids) == 1 and len(versions) == 1, (ids, versions)
                    return ids.pop(), versions.pop().removeprefix("graylane:")

                async def call(i: int) -> None:
                    body = {"model": MODEL, "prompt": "hello", "max_tokens": 1, "user": f"u{i}"}
                    if i % 10 == 3:  # streamed answers are rated alike
                        answer_id, version = await streamed(body)
                    else:
                        answer = await http.post("/v1/completions", json=body, headers=alice)
                        assert answer.status_code == 200, answer.text
                        answer_id = answer.json()["id"]
                        version = answer.headers["x-graylane-version"]
                    if i % 50 == 7:  # bob tries alice's answer first: not his to rate
                        no = await http.post(
                            "/v1/feedback", json={"id": answer_id, "rating": "down"}, headers=bob
                        )
                        rater.bob[no.status_code] += 1
                    vote = {"id": answer_id, "rating": rater.rating(version)}
                    taken = await http.post("/v1/feedback", json=vote, headers=alice)
                    rater.statuses[taken.status_code] += 1
                    if i % 50 == 9:  # a second rating of the same answer is refused
                        again = await http.post("/v1/feedback", json=vote, headers=alice)
                        rater.statuses[again.status_code] += 1

                i = 0
                while not ended() and i < MAX_CALLS:
                    await asyncio.gather(*(call(i + k) for k in range(CONCURRENCY)))
                    i += CONCURRENCY
                await watch.until(lambda t: t.epoch > split.epoch, 30)
        state = await _state(factory, spec.rollout_id)
    assert state is not None
    return state


def _last_decision(audits: list[audit_pb2.AuditRecord]) -> audit_pb2.AuditRecord:
    return [a for a in audits if a.kind != audit_pb2.DECISION_ROLLOUT_STARTED][-1]


async def test_a_candidate_rated_5_points_worse_loses(
    settings: Settings, factory: KafkaFactory, models: dict[str, Path], tmp_path: Path
) -> None:
    rater = Rater({"v1": 0, "v2": 20})
    state = await _ab(
        settings, factory, models, tmp_path / "policy.log", _spec("ab-worse", 3600.0), rater
    )
    assert state.phase == rollout_pb2.ROLLED_BACK
    decision = _last_decision(await read_audits(factory, rollout_id="ab-worse"))
    assert (decision.kind, decision.rule) == (audit_pb2.DECISION_ROLLBACK, "outcome_worse")
    evidence = decision.outcomes
    assert evidence.verdict == "candidate_worse" and evidence.high < 0.0
    assert evidence.baseline.total == evidence.baseline.rated  # v1: every rating up
    assert evidence.candidate.total < evidence.candidate.rated
    # What reached the outcomes topic: alice's ratings taken, once each; none of bob's.
    outcomes = await _outcomes(factory)
    assert len(outcomes) == rater.statuses[200]
    assert {o.tenant for o in outcomes} == {"alice"}
    assert len({o.request_id for o in outcomes}) == len(outcomes)
    assert rater.bob[404] > 0 and set(rater.bob) == {404}
    assert rater.statuses[409] > 0 and set(rater.statuses) == {200, 409}
    # The test counted no more than was rated, and passed nothing over.
    assert evidence.baseline.rated + evidence.candidate.rated <= len(outcomes)
    assert (evidence.unjoined, evidence.duplicates) == (0, 0)


async def test_equal_ratings_name_no_winner_and_end_as_no_difference(
    settings: Settings, factory: KafkaFactory, models: dict[str, Path], tmp_path: Path
) -> None:
    rater = Rater({"v1": 20, "v2": 20})
    state = await _ab(
        settings, factory, models, tmp_path / "policy.log", _spec("ab-equal", 20.0), rater
    )
    assert state.phase == rollout_pb2.PROMOTED
    audits = await read_audits(factory, rollout_id="ab-equal")
    decision = _last_decision(audits)
    assert decision.rule == "outcome_no_difference"
    assert decision.outcomes.verdict == "no_difference"
    assert decision.outcomes.low < 0.0 < decision.outcomes.high
    assert decision.outcomes.baseline.rated > 0 and decision.outcomes.candidate.rated > 0
    assert not any(a.rule in ("outcome_worse", "outcome_better") for a in audits)
