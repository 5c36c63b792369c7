"""The demo's live table: TTFT and TPOT p99 per version for generations, not for the rest."""

from __future__ import annotations

import sys

import pytest
from rich.console import Console

from graylane.app.demo.monitor import PIPE_WIDTH, Monitor, demo_console
from graylane.client import Result, Timing


def _result(version: str, total_ms: float, ttft_ms: float = 0.0, tpot_ms: float = 0.0) -> Result:
    return Result(
        request_id=f"{version}-{total_ms}-{ttft_ms}",
        model="demo-chat",
        version=version,
        variant="fp32",
        ok=True,
        error_code="",
        error_message="",
        timing=Timing(1.0, total_ms, total_ms, 1, ttft_ms, tpot_ms),
        worker_id="w1",
    )


def _rows(monitor: Monitor) -> dict[str, list[str]]:
    table = monitor.table("t")
    heads = [str(c.header) for c in table.columns]
    cells = [[str(x) for x in c.cells] for c in table.columns]
    rows = {cells[0][i]: [col[i] for col in cells] for i in range(len(cells[0]))}
    return {"": heads, **rows}


def test_generations_show_ttft_and_tpot_p99_per_version() -> None:
    m = Monitor("demo-chat")
    # v1: 100 generations, TTFT 50..149 ms, TPOT 10 ms; v2: same TTFT, TPOT 20 ms and 2x longer
    for i in range(100):
        m.on_result(_result("v1", 500.0 + i, ttft_ms=50.0 + i, tpot_ms=10.0))
        m.on_result(_result("v2", 1000.0 + i, ttft_ms=50.0 + i, tpot_ms=20.0))
    rows = _rows(m)
    heads = rows[""]
    assert heads[-2:] == ["TTFT p99 ms", "TPOT p99 ms"]
    ttft, tpot = heads.index("TTFT p99 ms"), heads.index("TPOT p99 ms")
    assert rows["v1"][ttft] == "148" and rows["v2"][ttft] == "148"  # p99 of 50..149
    assert rows["v1"][tpot] == "10.0" and rows["v2"][tpot] == "20.0"
    assert rows["v2"][heads.index("p99 ms")] == "1098"
    text = Console(width=200, record=True)
    text.print(m.table("demo-chat"))
    assert "TTFT/TPOT p99 of the generations" in text.export_text()


def test_a_version_without_generations_shows_a_dash_and_no_column_without_any() -> None:
    m = Monitor("demo-gpt")
    m.on_result(_result("v1", 40.0))
    assert "TTFT p99 ms" not in _rows(m)[""]
    m.on_result(_result("v2", 400.0, ttft_ms=30.0, tpot_ms=5.0))
    rows = _rows(m)
    ttft = rows[""].index("TTFT p99 ms")
    assert rows["v1"][ttft] == "-" and rows["v2"][ttft] == "30"


def test_failed_generations_do_not_count_in_ttft() -> None:
    m = Monitor("demo-chat")
    m.on_result(_result("v1", 400.0, ttft_ms=30.0, tpot_ms=5.0))
    bad = _result("v1", 9000.0, ttft_ms=9000.0, tpot_ms=90.0)
    m.on_result(Result(**{**bad.__dict__, "ok": False, "error_code": "INTERNAL"}))
    rows = _rows(m)
    assert rows["v1"][rows[""].index("TTFT p99 ms")] == "30"


def test_a_log_gets_the_whole_headings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Written to a pipe (make run's log, CI), Rich would take 80 columns and cut the
    eleven headings to 'ver…', 'wei…'; the demo's console takes PIPE_WIDTH."""
    m = Monitor("demo-chat")
    m.on_result(_result("v1", 500.0, ttft_ms=50.0, tpot_ms=10.0))
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    console = demo_console()
    assert console.width == PIPE_WIDTH
    with console.capture() as captured:
        console.print(m.table("demo-chat"))
    text = captured.get()
    assert "…" not in text
    for heading in ("version", "weight", "errors", "variant", "workers", "TTFT p99 ms"):
        assert heading in text
