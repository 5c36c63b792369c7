"""A rollout driven window by window: the spec, the windows and the `Run` driver the
rollout-controller tests share."""

from __future__ import annotations

from graylane.policy_engine.logic.agreement import AgreementStats
from graylane.policy_engine.logic.rollout import (
    Decision,
    RolloutState,
    apply_command,
    evaluate,
    start,
)
from graylane.policy_engine.logic.window import WindowStats
from graylane.rollouts.spec import GateMode, Gates, RolloutSpec, Step
from graylane.rollouts.vocabulary import ManualCommand
from tests.support.window_stats import window_stats

STEPS = (
    Step(1.0, 100, 30.0),
    Step(5.0, 100, 30.0),
    Step(25.0, 100, 30.0),
    Step(50.0, 100, 30.0),
    Step(100.0, 0, 0.0),
)
# The fixed-horizon gates' rules (error_rate, p99_latency); sequential ones: own tests.
SPEC = RolloutSpec(
    rollout_id="r1",
    model="m",
    baseline="v1",
    candidate="v2",
    steps=STEPS,
    gates=Gates(mode=GateMode.FIXED),
)
WINDOW = 10_000


def ws(
    version: str,
    start_ms: int,
    requests: int,
    errors: int = 0,
    *,
    p99: float = 20.0,
    p95: float | None = None,
    p50: float | None = None,
) -> WindowStats:
    """One version's window from ``start_ms``: p50 and mean p99 / 2, p95 p99 * 0.8."""
    return window_stats(
        p99,
        version=version,
        window_start_ms=start_ms,
        window_end_ms=start_ms + WINDOW,
        requests=requests,
        errors=errors,
        p50_ms=p50 if p50 is not None else p99 / 2,
        p95_ms=p95 if p95 is not None else p99 * 0.8,
        mean_ms=p99 / 2,
        throughput_rps=requests / 10,
    )


def window_pair(
    start_ms: int, base_n: int = 1000, cand_n: int = 200, **cand: float
) -> tuple[WindowStats, WindowStats]:
    errors = int(cand.pop("errors", 0))
    base_errors = int(cand.pop("base_errors", 0))
    candidate = ws(
        "v2",
        start_ms,
        cand_n,
        errors,
        p99=cand.get("p99", 20.0),
        p95=cand.get("p95"),
        p50=cand.get("p50"),
    )
    return ws("v1", start_ms, base_n, base_errors), candidate


class Run:
    """Drives a rollout through disjoint windows, one evaluation per window."""

    def __init__(self, spec: RolloutSpec = SPEC, t0: int = 1_000_000) -> None:
        self.spec = spec
        self.decisions: list[Decision] = [start(spec, t0)]
        self.t = t0

    @property
    def state(self) -> RolloutState:
        return self.decisions[-1].after

    def window(
        self,
        base_n: int = 1000,
        cand_n: int = 200,
        agreement: AgreementStats | None = None,
        **cand: float,
    ) -> Decision:
        baseline, candidate = window_pair(self.t, base_n, cand_n, **cand)
        self.t += WINDOW
        d = evaluate(self.state, self.spec, baseline, candidate, agreement, self.t)
        self.decisions.append(d)
        return d

    def command(self, command: ManualCommand) -> Decision:
        d = apply_command(self.state, self.spec, command, self.t, note="ops")
        self.decisions.append(d)
        return d
