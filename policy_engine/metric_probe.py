"""Reads the metric gates' PromQL queries from Prometheus (thin I/O).

One instant query per gate of every active rollout (``/api/v1/query``), asked
concurrently before each tick. A query must answer one number: a scalar, or a vector
with exactly one series. Anything else is inconclusive with its reason (Prometheus
unreachable or slow, an HTTP error, a query error, no series, several, not a number):
the pure gate (:mod:`~graylane.policy_engine.logic.metric_gates`) holds on it and never
counts it a pass.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

import httpx

from graylane.policy_engine.logic.metric_gates import MetricTarget

__all__ = ["PrometheusProbe", "value_of"]

MAX_CONCURRENT = 16
_MAX_REASON = 200


def value_of(answer: Any) -> tuple[float | None, str]:
    """The one number of a Prometheus query answer, or None and why not."""
    if not isinstance(answer, dict) or answer.get("status") != "success":
        error = answer.get("error") if isinstance(answer, dict) else None
        return None, f"query failed: {str(error or answer)[:_MAX_REASON]}"
    data = answer.get("data") or {}
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar" and isinstance(result, list) and len(result) == 2:
        raw = result[1]
    elif kind == "vector" and isinstance(result, list):
        if len(result) != 1:
            return None, f"{len(result)} series, not one"
        raw = (result[0].get("value") or [None, None])[1]
    else:
        return None, f"a {kind} answer, not a scalar or a one-series vector"
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return None, f"not a number: {str(raw)[:_MAX_REASON]}"
    if not math.isfinite(value):
        return None, f"not a finite number: {value}"
    return value, ""


class PrometheusProbe:
    """Asks ``url`` (Prometheus' base URL) each target's query."""

    def __init__(self, url: str, *, timeout_s: float = 5.0) -> None:
        self._url = url.rstrip("/") + "/api/v1/query"
        self._timeout_s = timeout_s
        self._client: httpx.AsyncClient | None = None

    async def read(
        self, targets: Sequence[MetricTarget]
    ) -> list[tuple[MetricTarget, float | None, str]]:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self._timeout_s)
        client = self._client
        gate = asyncio.Semaphore(MAX_CONCURRENT)

        async def one(target: MetricTarget) -> tuple[MetricTarget, float | None, str]:
            async with gate:
                try:
                    res = await client.get(self._url, params={"query": target.query})
                except httpx.HTTPError as exc:
                    return target, None, f"Prometheus unreachable: {type(exc).__name__}: {exc}"
            try:
                answer = res.json()
            except ValueError:
                return target, None, f"HTTP {res.status_code}: not JSON"
            value, why = value_of(answer)
            if value is None and res.status_code != 200:
                why = f"HTTP {res.status_code}: {why}"
            return target, value, why[:_MAX_REASON]

        return list(await asyncio.gather(*(one(t) for t in targets)))

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
