"""Chaos bench accounting: lost and duplicates from acked/answered sets."""

from __future__ import annotations

import json

from graylane.app.bench.chaos import account_phase, report_line


def test_lost_duplicates_and_report_line() -> None:
    result = account_phase(
        acked=["a", "b", "c", "d", "e"],
        answers=["a", "b", "b", "b", "c", "zz"],
        errored=["d"],
        recovery_s=2.5,
        services_alive=True,
    )
    assert (result.acked, result.answered, result.lost, result.duplicates) == (5, 3, 1, 2)
    line = report_line({"worker": result}, rollout_resumed_same_step=False)
    assert json.loads(line) == {
        "phases": {
            "worker": {
                "acked": 5,
                "answered": 3,
                "lost": 1,
                "duplicates": 2,
                "recovery_s": 2.5,
                "services_alive": True,
            }
        },
        "rollout_resumed_same_step": False,
    }
