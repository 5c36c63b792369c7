"""The path-capacity probe's count: results/s of its second half, sheds left out."""

from __future__ import annotations

import pytest

from graylane.app.bench.path import delivered_rps
from graylane.app.demo.monitor import Monitor, RequestSample


def _monitor(samples: list[RequestSample]) -> Monitor:
    m = Monitor("m")
    m.history.extend(samples)
    return m


def test_counts_the_second_half_only() -> None:
    # 8 s probe from t=10: a queue forms in the first half (few results), then 4/s
    early = [RequestSample(10.0 + i * 0.5, "v1", "fp32", 50.0, True) for i in range(8)]
    late = [RequestSample(14.0 + i * 0.25, "v1", "fp32", 900.0, True) for i in range(16)]
    assert delivered_rps(_monitor(early + late), 10.0, 18.0, 8.0) == pytest.approx(16 / 4.0)


def test_sheds_are_not_served() -> None:
    served = [RequestSample(14.0 + i * 0.5, "v1", "fp32", 300.0, True) for i in range(8)]
    shed = [RequestSample(14.1 + i * 0.5, "v1", "fp32", 5.0, False, shed=True) for i in range(8)]
    assert delivered_rps(_monitor(served + shed), 10.0, 18.0, 8.0) == pytest.approx(2.0)


def test_an_empty_span_delivers_nothing() -> None:
    assert delivered_rps(_monitor([]), 10.0, 14.0, 8.0) == 0.0
