"""Asking targets for the answers of an evaluation set, and an LLM judge for its verdicts.

A target is what answers:

- :class:`VersionTarget`: one version of a model over Kafka, straight to its version topic
  (the worker, whatever serves it: Graylane's decoder or an engine server). A chat item
  travels as messages (engine servers apply their own template) and as a ChatML prompt
  (what Graylane's decoder reads), as the gateway sends it;
- :class:`OpenAITarget`: an OpenAI-compatible endpoint: an engine server (one variant of
  a version, a rung of its ladder) or the gateway (with its API key).

Every answer is greedy (temperature 0), ``max_tokens`` as the item says, at most
``concurrency`` calls at once. A call that fails is an answer of ``None`` (scored 0 and
counted as an error), never the end of the run. :class:`Judge` asks an OpenAI-compatible
model whether an answer meets an item's rubric.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from graylane.client import ClientError, GraylaneClient, Task
from graylane.evaluation.scoring import ItemScore, judge_prompt, judge_verdict, score_answer
from graylane.evaluation.sets import EvalItem, ExpectationKind
from graylane.v1 import inference_pb2

__all__ = [
    "Answer",
    "EvalTarget",
    "Judge",
    "OpenAITarget",
    "VersionTarget",
    "answer_all",
    "score_all",
]

_JSON_MODE = json.dumps({"type": "json_object"})


@dataclass(frozen=True)
class Answer:
    item: EvalItem
    text: str | None
    """None: the call failed (``error`` says why)."""
    error: str = ""


class EvalTarget(Protocol):
    @property
    def name(self) -> str: ...

    async def answer(self, item: EvalItem) -> Answer: ...


def _chatml(item: EvalItem) -> str:
    parts = [f"<|im_start|>{t.role}\n{t.content}<|im_end|>\n" for t in item.messages]
    return "".join(parts) + "<|im_start|>assistant\n"


@dataclass
class VersionTarget:
    """One version of ``model`` over Kafka (its version topic)."""

    client: GraylaneClient
    model: str
    version: str
    timeout_s: float = 120.0

    @property
    def name(self) -> str:
        return f"{self.model} {self.version}"

    async def answer(self, item: EvalItem) -> Answer:
        chat = bool(item.messages)
        kwargs: dict[str, Any] = {
            "task": Task.GENERATE,
            "max_new_tokens": item.max_tokens,
            "temperature": 0.0,
        }
        if chat:
            kwargs["messages"] = [
                inference_pb2.ChatMessage(role=t.role, content=t.content) for t in item.messages
            ]
            kwargs["prompt"] = _chatml(item)
            kwargs["turn_end"] = ["<|im_end|>"]
        else:
            kwargs["prompt"] = item.prompt
        if item.json_mode:
            kwargs["engine_options"] = inference_pb2.EngineOptions(response_format_json=_JSON_MODE)
        try:
            result = await self.client.infer(
                self.model, timeout=self.timeout_s, version=self.version, **kwargs
            )
        except (ClientError, TimeoutError) as exc:
            return Answer(item, None, str(exc)[:200])
        return Answer(item, result.text)


@dataclass
class OpenAITarget:
    """An OpenAI-compatible endpoint: an engine server, or the gateway."""

    name: str
    http: httpx.AsyncClient
    """Its ``base_url`` is the endpoint's (the API is under ``/v1``)."""
    model: str = ""
    """The calls' ``model``; empty: the first the endpoint lists."""

    async def _model(self) -> str:
        if not self.model:
            listed = (await self.http.get("/v1/models")).json().get("data") or [{}]
            self.model = str(listed[0].get("id", ""))
        return self.model

    async def answer(self, item: EvalItem) -> Answer:
        body: dict[str, Any] = {
            "model": await self._model(),
            "max_tokens": item.max_tokens,
            "temperature": 0,
        }
        if item.json_mode:
            body["response_format"] = {"type": "json_object"}
        if item.messages:
            body["messages"] = [{"role": t.role, "content": t.content} for t in item.messages]
            route = "/v1/chat/completions"
        else:
            body["prompt"] = item.prompt
            route = "/v1/completions"
        try:
            answer = await self.http.post(route, json=body)
        except httpx.HTTPError as exc:
            return Answer(item, None, f"{type(exc).__name__}: {exc}"[:200])
        if answer.status_code != 200:
            return Answer(item, None, f"HTTP {answer.status_code}: {answer.text[:160]}")
        choice = (answer.json().get("choices") or [{}])[0]
        text = choice.get("message", {}).get("content") if item.messages else choice.get("text")
        return Answer(item, text if isinstance(text, str) else "")


@dataclass
class Judge:
    """An LLM that grades answers against a rubric (any OpenAI-compatible chat endpoint)."""

    http: httpx.AsyncClient
    model: str = ""

    async def grade(self, item: EvalItem, answer: str) -> ItemScore:
        target = OpenAITarget("judge", self.http, self.model)
        body = {
            "model": await target._model(),
            "messages": [{"role": "user", "content": judge_prompt(item, answer)}],
            "max_tokens": 4,
            "temperature": 0,
        }
        try:
            reply = await self.http.post("/v1/chat/completions", json=body)
            content = (reply.json().get("choices") or [{}])[0].get("message", {}).get("content")
        except (httpx.HTTPError, ValueError) as exc:
            return ItemScore(item.id, 0.0, False, f"judge failed: {type(exc).__name__}", True)
        return judge_verdict(item, content if isinstance(content, str) else "")


async def answer_all(
    target: EvalTarget,
    items: Sequence[EvalItem],
    *,
    concurrency: int = 4,
    progress: Callable[[Answer], None] | None = None,
) -> list[Answer]:
    """Every item's answer from ``target``, in the items' order."""
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(item: EvalItem) -> Answer:
        async with gate:
            answer = await target.answer(item)
        if progress is not None:
            progress(answer)
        return answer

    return list(await asyncio.gather(*(one(item) for item in items)))


async def score_all(answers: Sequence[Answer], judge: Judge | None) -> list[ItemScore]:
    """The score of every answer (``judge`` grades the items that name a rubric; without
    one they are left out)."""
    scores = []
    for answer in answers:
        item = answer.item
        if answer.text is None:
            scores.append(ItemScore(item.id, 0.0, False, answer.error, error=True))
        elif item.expect.kind is ExpectationKind.JUDGE:
            if judge is not None:
                scores.append(await judge.grade(item, answer.text))
        else:
            scores.append(score_answer(item, answer.text))
    return scores
