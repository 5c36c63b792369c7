"""The demo's report: events numbered on the chart with a table beside it, and no two
texts of it overlapping (measured with matplotlib's renderer), even when events crowd
into the same seconds; one time axis with the printed steps."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
from matplotlib.text import Text

from graylane.app.demo.monitor import Monitor
from graylane.app.demo.report import (
    EVENT_NUMBER_GID,
    EVENT_ROW_GID,
    render_report,
    write_report,
)


def crowded_monitor() -> Monitor:
    m = Monitor("demo-gpt", t0=time.monotonic() - 60.0)
    m.timeline.weights = [(0.0, {"v1": 100.0}), (20.0, {"v1": 90.0, "v2": 10.0})]
    m.timeline.weights += [(40.0, {"v2": 100.0})]
    m.timeline.p99["v1"] = [(float(t), 40.0 + t % 7) for t in range(0, 60, 2)]
    m.timeline.p99["v2"] = [(float(t), 35.0 + t % 5) for t in range(20, 60, 2)]
    m.timeline.variants["v2"] = [(20.0, "fp32"), (45.0, "int8-dynamic"), (55.0, "fp32")]
    texts = [
        "registry stable version before the rollout: v1",
        "start rollout ro-demo-gpt-1765000000-a: v1 -> v2",
        "v2 promoted",
        "registry stable version: v1 -> v2",
        "start rollout ro-demo-gpt-1765000000-b: v2 -> v3 with a reason long enough to wrap "
        "over more than one line of the table",
        "v3 rolled back automatically",
        "QoS policy on v2: fp32 -> int8-dynamic, back up by load",
        "load spike x3.0 (135.0 req/s) for 40s",
        "QoS stepped down to int8-dynamic",
        "scaled out to 2 workers",
        "spike over; 12 requests shed so far",
        "scaled back in to 1 worker",
        "QoS stepped back up to fp32",
        "graylane rollout undo demo-gpt (stable v2)",
        "reverted: 100 % to v1; registry stable version: v2 -> v1",
    ]
    # Crowded: several events in the same second, as the story's waits produce them.
    times = [6.0, 6.1, 20.0, 20.2, 24.0, 30.0, 34.0, 39.0, 39.3, 39.6, 45.0, 45.1, 52.0, 55, 55.2]
    m.timeline.events = list(zip(times, texts, strict=True))
    return m


def event_texts(fig: object) -> list[Text]:
    return [
        t
        for t in fig.findobj(Text)  # type: ignore[attr-defined]
        if t.get_gid() in (EVENT_NUMBER_GID, EVENT_ROW_GID) and t.get_visible()
    ]


def test_event_labels_and_rows_never_overlap() -> None:
    monitor = crowded_monitor()
    fig = render_report(monitor)
    renderer = fig.canvas.get_renderer()
    texts = event_texts(fig)
    numbers = [t for t in texts if t.get_gid() == EVENT_NUMBER_GID]
    rows = [t for t in texts if t.get_gid() == EVENT_ROW_GID]
    n = len(monitor.timeline.events)
    assert [t.get_text() for t in numbers] == [str(i) for i in range(1, n + 1)]
    assert len(rows) == n and all(r.get_text().lstrip().startswith(f"{i}  ") for i, r in
                                  enumerate(rows, start=1))  # fmt: skip
    boxes = [(t.get_text()[:20], t.get_window_extent(renderer)) for t in texts]
    overlapping = [
        (a, b)
        for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2)
        if box_a.overlaps(box_b)
    ]
    assert overlapping == []
    # the other texts too: titles, axis labels and ticks never sit under an event's text
    others = [
        t.get_window_extent(renderer)
        for t in fig.findobj(Text)
        if t.get_text() and t.get_visible() and t.get_gid() not in (EVENT_NUMBER_GID, EVENT_ROW_GID)
    ]
    assert not [b for _, b in boxes for o in others if b.overlaps(o)]
    # everything is on the page, the tick labels too
    page = fig.bbox
    ticks = [t.get_window_extent(renderer) for ax in fig.axes for t in ax.get_yticklabels()]
    assert all(page.x0 <= b.x0 for b in ticks if b.width > 0)
    assert all(
        page.x0 <= b.x0 and b.x1 <= page.x1 and page.y0 <= b.y0 and b.y1 <= page.y1
        for _, b in boxes
    )


def test_one_time_axis_with_the_printed_steps(tmp_path: Path) -> None:
    fig = render_report(crowded_monitor())
    labels = [ax.get_xlabel() for ax in fig.axes if ax.get_xlabel()]
    assert labels == ["seconds since the demo started (the printed steps' and audit's clock)"]
    rows = [t.get_text() for t in event_texts(fig) if t.get_gid() == EVENT_ROW_GID]
    assert rows[2].split()[:2] == ["3", "20.0s"]  # the table's times are the axis's
    path = write_report(crowded_monitor(), tmp_path / "report.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_monitor_counts_from_the_origin_it_is_given() -> None:
    m = Monitor("x", t0=time.monotonic() - 30.0)  # the demo started 30 s ago
    m.event("e")
    assert 30.0 <= m.timeline.events[0][0] < 35.0


def test_a_model_with_a_rung_but_no_routing_weights_is_drawn_on_the_variant_chart_only() -> None:
    m = crowded_monitor()
    m.timeline.variants["smollm2-onnx 1.0.0"] = [(5.0, "fp32"), (9.0, "int8-weight-only")]
    fig = render_report(m)
    weight_ax, p99_ax, variant_ax = (ax for ax in fig.axes if ax.get_ylabel())
    labels = {ax: {line.get_label() for line in ax.get_lines()} for ax in fig.axes}
    assert "smollm2-onnx 1.0.0" in labels[variant_ax]
    assert "smollm2-onnx 1.0.0" not in labels[weight_ax] | labels[p99_ax]
    drawn = next(x for x in variant_ax.get_lines() if x.get_label() == "smollm2-onnx 1.0.0")
    assert list(drawn.get_ydata()) == [0, 1]  # fp32, then a lower rung
