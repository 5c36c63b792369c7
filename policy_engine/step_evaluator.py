"""Running the evaluations rollout steps require: the set over Kafka, scores back to the core.

The adapter of :mod:`graylane.policy_engine.logic.step_evaluation`. For each
:class:`~graylane.policy_engine.logic.step_evaluation.EvaluationRequest` the core says is
due, :class:`StepEvaluator` reads the set, sends every item to the baseline's and the
candidate's version topics at once (greedy, as ``graylane eval`` does: the real path, the
workers and whatever engine serves each version), scores the answers, summarizes each
version with its interval and compares them on the same items. The
:class:`~graylane.policy_engine.logic.step_evaluation.EvaluationOutcome` goes back to the
core; the next decision judges it. Nothing here decides.

One evaluation per (rollout, step) runs at a time, in a task of its own, so the engine's
loop never waits on one. An evaluation that cannot run (the set unreadable, the broker
gone) ends as an outcome with its problem, never as an exception out of the engine.
Items graded by an LLM judge are left out: the engine calls no judge.

The evaluation's requests are real traffic to both versions (their telemetry counts
them); keep gating sets small, tens of items.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from graylane.acls import EVALUATION_CLIENT_ID
from graylane.client import GraylaneClient
from graylane.clock import Clock
from graylane.evaluation.runner import VersionTarget, answer_all, score_all
from graylane.evaluation.sets import EvalSetError, ExpectationKind, load_set
from graylane.evaluation.summary import compare, summarize
from graylane.kafka.seam import KafkaFactory
from graylane.policy_engine.logic.step_evaluation import EvaluationOutcome, EvaluationRequest

__all__ = ["StepEvaluator", "run_evaluation"]

log = logging.getLogger(__name__)

TIMEOUT_S = 180.0
"""How long one item's answer may take (a loaded engine queues the set behind traffic)."""


async def run_evaluation(
    client: GraylaneClient,
    request: EvaluationRequest,
    clock: Clock,
    *,
    concurrency: int = 4,
    timeout_s: float = TIMEOUT_S,
) -> EvaluationOutcome:
    """Both versions' answers to the request's set, scored and compared."""
    gate = request.gate

    def unusable(problem: str, digest: str = "") -> EvaluationOutcome:
        return EvaluationOutcome(
            rollout_id=request.rollout_id,
            step_index=request.step_index,
            gate=gate,
            set_sha256=digest,
            problem=problem,
            finished_at_ms=clock(),
        )

    try:
        evaluation_set = load_set(Path(gate.set_path))
    except EvalSetError as exc:
        return unusable(str(exc))
    items = [i for i in evaluation_set.items if i.expect.kind is not ExpectationKind.JUDGE]
    if not items:
        return unusable(f"{gate.set_path}: no item the engine can score (only judge items)")
    base = VersionTarget(client, request.model, request.baseline, timeout_s=timeout_s)
    cand = VersionTarget(client, request.model, request.candidate, timeout_s=timeout_s)
    base_answers, cand_answers = await asyncio.gather(
        answer_all(base, items, concurrency=concurrency),
        answer_all(cand, items, concurrency=concurrency),
    )
    base_scores = await score_all(base_answers, None)
    cand_scores = await score_all(cand_answers, None)
    return EvaluationOutcome(
        rollout_id=request.rollout_id,
        step_index=request.step_index,
        gate=gate,
        set_sha256=evaluation_set.digest,
        baseline=summarize(request.baseline, base_scores),
        candidate=summarize(request.candidate, cand_scores),
        comparison=compare(request.baseline, base_scores, request.candidate, cand_scores),
        finished_at_ms=clock(),
    )


@dataclass
class StepEvaluator:
    """Runs due evaluations in tasks of their own; hands each outcome to ``deliver``."""

    factory: KafkaFactory
    clock: Clock
    deliver: Callable[[EvaluationOutcome], object]
    client_id: str = EVALUATION_CLIENT_ID
    _client: GraylaneClient | None = None
    _running: dict[tuple[str, int], asyncio.Task[None]] = field(default_factory=dict)

    def schedule(self, due: list[EvaluationRequest]) -> None:
        """Start each due evaluation not already running."""
        for request in due:
            key = (request.rollout_id, request.step_index)
            if key in self._running:
                continue
            log.info(
                "evaluating %s against %s on %s before step %d",
                request.candidate,
                request.baseline,
                request.gate.set_path,
                request.step_index + 1,
            )
            self._running[key] = asyncio.create_task(self._run(key, request))

    async def _run(self, key: tuple[str, int], request: EvaluationRequest) -> None:
        try:
            outcome = await run_evaluation(await self._started(), request, self.clock)
        except Exception as exc:  # the broker, a reply topic: an outcome, never a crash
            log.exception("evaluation of %s step %d failed", request.rollout_id, key[1] + 1)
            outcome = EvaluationOutcome(
                rollout_id=request.rollout_id,
                step_index=request.step_index,
                gate=request.gate,
                problem=f"the evaluation failed: {type(exc).__name__}: {exc}"[:300],
                finished_at_ms=self.clock(),
            )
        finally:
            self._running.pop(key, None)
        log.info("evaluation of %s step %d: %s", request.rollout_id, key[1] + 1, outcome.verdict)
        self.deliver(outcome)

    async def _started(self) -> GraylaneClient:
        if self._client is None:
            client = GraylaneClient(self.factory, client_id=self.client_id)
            await client.start()
            self._client = client
        return self._client

    async def close(self) -> None:
        for task in list(self._running.values()):
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
        if self._client is not None:
            await self._client.close()
            self._client = None
