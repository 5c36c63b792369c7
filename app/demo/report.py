"""The demo's report (``.local/report.png``): weights, p99 per version, active variant,
and the story's events, numbered on the chart and listed in a table beside it.

One time axis: seconds since the demo started, the clock of the printed steps and of
the printed audit timeline (:class:`~graylane.app.demo.monitor.Monitor` is given that
origin). Event numbers never overlap: each goes on the lowest row of a strip above the
charts where it clears the numbers already there (widths measured with the renderer),
the strip as tall as the rows need; each row of the table starts below the one before.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from graylane.app.demo.monitor import Monitor

__all__ = ["EVENT_NUMBER_GID", "EVENT_ROW_GID", "render_report", "write_report"]

EVENT_NUMBER_GID = "event-number"
"""The ``gid`` of an event's number on the chart."""
EVENT_ROW_GID = "event-row"
"""The ``gid`` of an event's row in the table beside the chart."""
_WRAP = 58
"""Characters per line of an event's text in the table."""


def render_report(monitor: Monitor) -> Any:
    """The report as a matplotlib figure (drawn, so every text has its final extent)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = sorted(monitor.timeline.events)
    lines = sum(len(textwrap.wrap(t, _WRAP)) or 1 for _, t in events)
    height = max(9.0, 0.16 * lines + 2.0)
    fig = plt.figure(figsize=(16, height))
    grid = fig.add_gridspec(
        4, 2, width_ratios=(2.2, 1.0), height_ratios=(0.3, 3, 3, 3), hspace=0.12, wspace=0.04
    )
    strip = fig.add_subplot(grid[0, 0])
    axes = [fig.add_subplot(grid[1, 0], sharex=strip)]
    axes += [fig.add_subplot(grid[i, 0], sharex=strip) for i in (2, 3)]
    table_ax = fig.add_subplot(grid[:, 1])
    _plot_series(monitor, axes)
    for ax in axes[:2]:
        ax.tick_params(labelbottom=False)
    axes[2].set_xlabel("seconds since the demo started (the printed steps' and audit's clock)")
    for at, _ in events:
        for ax in axes:
            ax.axvline(at, color="grey", alpha=0.35, linestyle="--", linewidth=0.8)
    fig.suptitle("Graylane demo: weights, p99 per version, active variant; numbered events")
    fig.subplots_adjust(left=0.08, right=0.99, top=1 - 0.9 / height, bottom=0.7 / height)
    strip.set_axis_off()
    fig.canvas.draw()
    rows = _number_rows(fig, axes[0], [at for at, _ in events])
    # The strip above the charts holds as many rows of numbers as the crowding needs.
    strip_in = 0.25 * (max(rows, default=0) + 1) + 0.1
    chart_in = height * (1 - 1.6 / height) - strip_in
    grid.set_height_ratios((strip_in, chart_in / 3, chart_in / 3, chart_in / 3))
    fig.subplots_adjust()  # re-apply the grid's ratios
    strip.set_ylim(-0.5, max(rows, default=0) + 0.5)
    for n, (at, row) in enumerate(zip((at for at, _ in events), rows, strict=True), start=1):
        strip.text(at, row, str(n), **_NUMBER_STYLE)
    _event_table(fig, table_ax, events)
    fig.canvas.draw()
    return fig


_NUMBER_STYLE: dict[str, Any] = {
    "ha": "center",
    "va": "center",
    "fontsize": 8,
    "bbox": {"boxstyle": "round,pad=0.15", "fc": "white", "ec": "grey", "lw": 0.6},
    "clip_on": False,
    "gid": EVENT_NUMBER_GID,
}


def write_report(monitor: Monitor, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig = render_report(monitor)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_series(monitor: Monitor, axes: list[Any]) -> None:
    timeline = monitor.timeline
    versions = sorted(
        {v for _, w in timeline.weights for v in w} | set(timeline.p99) | set(timeline.variants)
    )
    weighted = {v for _, w in timeline.weights for v in w}
    for version in versions:
        points = [(t, w.get(version, 0.0)) for t, w in timeline.weights]
        if points and version in weighted:  # a model without routing weights has none
            xs, ys = zip(*points, strict=True)
            axes[0].step([*xs, monitor.now()], [*ys, ys[-1]], where="post", label=version)
        p99 = timeline.p99.get(version, [])
        if p99:
            xs, ys = zip(*p99, strict=True)
            axes[1].plot(xs, ys, label=version)
        variants = timeline.variants.get(version, [])
        if variants:
            xs, labels = zip(*variants, strict=True)
            axes[2].plot(
                xs, [1 if v != "fp32" else 0 for v in labels], drawstyle="steps-post", label=version
            )
    axes[0].set_ylabel("weight %")
    axes[0].set_ylim(-5, 105)
    axes[1].set_ylabel("p99 ms (5 s window)")
    axes[2].set_ylabel("variant")
    axes[2].set_yticks([0, 1], ["fp32", "a lower rung"])
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", fontsize=8)
        ax.grid(alpha=0.3)


def _number_rows(fig: Any, ax: Any, times: list[float]) -> list[int]:
    """Each event's row (0 = lowest): the lowest where its number clears, left and
    right, every number already on that row (widths measured with the renderer)."""
    renderer = fig.canvas.get_renderer()
    probe = ax.text(0, 0, "", **{k: v for k, v in _NUMBER_STYLE.items() if k != "gid"})
    taken: list[list[tuple[float, float]]] = []
    rows: list[int] = []
    for n, at in enumerate(times, start=1):
        probe.set_text(str(n))
        width = probe.get_window_extent(renderer).width + 4.0  # px, with a gap
        x = ax.transData.transform((at, 0))[0]
        span = (x - width / 2, x + width / 2)
        row = next(
            (i for i, used in enumerate(taken) if all(span[1] < a or b < span[0] for a, b in used)),
            len(taken),
        )
        if row == len(taken):
            taken.append([])
        taken[row].append(span)
        rows.append(row)
    probe.remove()
    return rows


def _event_table(fig: Any, ax: Any, events: list[tuple[float, str]]) -> None:
    """One row per event: its number, its time, its text (wrapped); each row starts
    below the previous one's measured bottom."""
    renderer = fig.canvas.get_renderer()
    ax.set_axis_off()
    ax.set_title("events", loc="left", fontsize=10)
    to_axes = ax.transAxes.inverted()
    y = 1.0
    for n, (at, text) in enumerate(events, start=1):
        head = f"{n:>2}  {at:6.1f}s  "
        wrapped = textwrap.fill(
            head + (text or "-"), _WRAP + len(head), subsequent_indent=" " * len(head)
        )
        row = ax.text(
            0.0,
            y,
            wrapped,
            transform=ax.transAxes,
            va="top",
            ha="left",
            fontsize=7.5,
            family="monospace",
            gid=EVENT_ROW_GID,
        )
        box = row.get_window_extent(renderer)
        y = to_axes.transform((box.x0, box.y0))[1] - 0.004
