"""Synthetic telemetry for ``graylane bench decisions``: one simulated rollout.

The rollout controller runs as the policy engine runs it: every 2 s step it
reads a 10 s window of each side (and the newest step alone, for the
sequential gates) plus liveness signals. Traffic is drawn per step:

- Poisson arrivals; the candidate gets its weight's share of ``total_rps``.
- Service time: lognormal (median 20 ms, sigma 0.35) times a common per-step
  load factor (both sides), plus **bursts**: on each side independently, a
  step has a 5 % chance of a stall that makes 5-20 % of its requests 2-4x
  slower.
- Queue wait: exponential, mean 3 ms; end-to-end latency = queue + service.
- Errors: a 0.1 % background rate on both sides (a common SLO).

Scenarios change the candidate from ``onset_s`` on (0 = from the start):
p99 x1.5 (the slowest 10 % of requests 1.5x slower), service time x1.3 /
x1.5, +1 / +5 pp errors, dead (no telemetry, growing lag, from 20 s), and
backlog (healthy model behind a queue of 1.5 s that drains over 45 s).

Generation scenarios (``gen_*``) draw generations instead: per request a prefill
(lognormal, median 60 ms, sigma 0.3), a time per output token (lognormal, median
20 ms, sigma 0.15; the per-request mean over its decode), and an output length
with a heavy tail (lognormal, median 60 tokens, sigma 0.9, capped at 512: the
capped ones end on LENGTH, the others on EOS). TTFT = queue + prefill; the
whole-request service time = prefill + TPOT x (tokens - 1), so it mostly
measures length. Bursts slow 5-20 % of a step's generations 2-4x (prefill and
every token). Scenarios: healthy, prefill x1.5 (TTFT x1.5 but its 3 ms mean
queue), TPOT x1.3, and output length x2 at the same per-token speed (whole
request about 2x slower: must not read as a latency regression, and is reported
as ``output_length_drift``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from graylane.histogram import DEFAULT_GROWTH, DEFAULT_MIN_MS, LatencyHistogram
from graylane.policy_engine.logic.liveness import LagSample, VersionLiveness
from graylane.policy_engine.logic.rollout import Decision, RolloutSignals, evaluate, start
from graylane.policy_engine.logic.window import GenerationStats, WindowStats
from graylane.rollouts.spec import GateMode, Gates, RolloutSpec, Step
from graylane.rollouts.vocabulary import DecisionKind, DecisionRule

STEP_MS = 2_000
PANES = 5  # 10 s windows
N_BUCKETS = 320  # up to about 4 minutes
LOG_G = math.log(DEFAULT_GROWTH)
_UPPER = DEFAULT_MIN_MS * DEFAULT_GROWTH ** np.arange(N_BUCKETS)
_LOWER = np.concatenate(([0.0], _UPPER[:-1]))
_REP = np.where(_LOWER > 0, 2 * _LOWER * _UPPER / np.maximum(_LOWER + _UPPER, 1e-300), _UPPER)

MEDIAN_MS = 20.0
SIGMA = 0.35
BASE_ERROR = 0.001
BURST_P = 0.05
QUEUE_MEAN_MS = 3.0
FIRST_WEIGHT = 5.0
BENCH_STEPS = (
    Step(FIRST_WEIGHT, 100, 30.0),
    Step(25.0, 200, 30.0),
    Step(50.0, 400, 30.0),
    Step(100.0),
)
HORIZON_S = 180.0

GEN_PREFILL_MS = 60.0
GEN_PREFILL_SIGMA = 0.3
GEN_TPOT_MS = 20.0
GEN_TPOT_SIGMA = 0.15
GEN_LENGTH_MEDIAN = 60.0
GEN_LENGTH_SIGMA = 0.9
GEN_MAX_TOKENS = 512
LATENCY_RULES = frozenset(
    {
        DecisionRule.P99_RATIO,
        DecisionRule.P99_SEVERE,
        DecisionRule.SERVICE_TIME_SEQUENTIAL,
        DecisionRule.TTFT_P99_RATIO,
        DecisionRule.TPOT_P99_RATIO,
        DecisionRule.TTFT_SEQUENTIAL,
        DecisionRule.TPOT_SEQUENTIAL,
    }
)
"""Rules of a latency verdict (a length change must never roll back on one)."""


class Scenario(Enum):
    HEALTHY = "healthy"
    P99_X15 = "p99_x1.5"
    SERVICE_X13 = "service_x1.3"
    SERVICE_X15 = "service_x1.5"
    ERRORS_1PP = "errors_+1pp"
    ERRORS_5PP = "errors_+5pp"
    DEAD = "dead"
    BACKLOG = "backlog"
    GEN_HEALTHY = "gen_healthy"
    GEN_TTFT_X15 = "gen_ttft_x1.5"
    GEN_TPOT_X13 = "gen_tpot_x1.3"
    GEN_LENGTH_X2 = "gen_length_x2"

    @property
    def harmful(self) -> bool:
        """A rollback is the right outcome."""
        return self not in (
            Scenario.HEALTHY,
            Scenario.BACKLOG,
            Scenario.GEN_HEALTHY,
            Scenario.GEN_LENGTH_X2,
        )

    @property
    def healthy(self) -> bool:
        """Nothing is wrong: any rollback is a false one."""
        return self in (Scenario.HEALTHY, Scenario.GEN_HEALTHY)

    @property
    def generative(self) -> bool:
        return self.value.startswith("gen_")

    @property
    def onset_s(self) -> float:
        return 20.0 if self is Scenario.DEAD else 0.0


@dataclass(frozen=True)
class RunResult:
    rolled_back: bool
    promoted: bool
    detect_s: float | None
    rule: str
    drift_s: float | None = None
    """Seconds from the onset to the first ``output_length_drift`` verdict (None: none)."""

    @property
    def latency_rollback(self) -> bool:
        return self.rolled_back and self.rule in LATENCY_RULES


def bucket_counts(values: np.ndarray) -> np.ndarray:
    idx = np.ceil(np.log(np.maximum(values, DEFAULT_MIN_MS) / DEFAULT_MIN_MS) / LOG_G)
    idx = np.clip(idx.astype(np.int64), 0, N_BUCKETS - 1)
    return np.bincount(idx, minlength=N_BUCKETS)


_QS = np.array([0.5, 0.95, 0.99])


def quantiles(counts: np.ndarray) -> tuple[float, float, float]:
    """p50, p95, p99 as :class:`LatencyHistogram` answers them (nearest rank)."""
    cum = np.cumsum(counts)
    total = int(cum[-1])
    if not total:
        return 0.0, 0.0, 0.0
    ranks = np.maximum(1, np.ceil(_QS * total - 1e-9))
    p50, p95, p99 = _REP[np.searchsorted(cum, ranks)].tolist()
    return p50, p95, p99


def histogram(counts: np.ndarray) -> LatencyHistogram:
    nz = np.flatnonzero(counts)
    return LatencyHistogram(
        buckets=dict(zip(nz.tolist(), counts[nz].tolist(), strict=True)),
        sum_ms=float(counts @ _REP),
        max_ms=float(_REP[nz[-1]]) if nz.size else 0.0,
    )


@dataclass
class _Generations:
    ttft: np.ndarray
    tpot: np.ndarray
    prefill: np.ndarray
    lengths: np.ndarray
    tokens: int
    ended_by_model: int


@dataclass
class _Pane:
    end_ms: int
    requests: int
    errors: int
    e2e: np.ndarray
    service: np.ndarray
    queue: np.ndarray
    generations: _Generations | None = None


def _generation_stats(panes: list[_Pane], requests: int) -> GenerationStats | None:
    gens = [p.generations for p in panes if p.generations is not None]
    if not gens:
        return None
    return GenerationStats(
        generations=requests,
        ttft=histogram(np.add.reduce([g.ttft for g in gens])),
        tpot=histogram(np.add.reduce([g.tpot for g in gens])),
        inter_token_p99=LatencyHistogram(),
        prefill=histogram(np.add.reduce([g.prefill for g in gens])),
        output_tokens=histogram(np.add.reduce([g.lengths for g in gens])),
        generated_tokens=sum(g.tokens for g in gens),
        ended_by_model=sum(g.ended_by_model for g in gens),
    )


@dataclass
class _Side:
    version: str
    panes: list[_Pane] = field(default_factory=list)

    def stats(self, end_ms: int, n_panes: int) -> WindowStats | None:
        start_ms = end_ms - n_panes * STEP_MS
        panes = [p for p in self.panes[-n_panes:] if start_ms < p.end_ms <= end_ms]
        if not panes:
            return None
        requests = sum(p.requests for p in panes)
        if not requests:
            return None
        if len(panes) == 1:
            e2e, service, queue = panes[0].e2e, panes[0].service, panes[0].queue
        else:
            e2e = np.add.reduce([p.e2e for p in panes])
            service = np.add.reduce([p.service for p in panes])
            queue = np.add.reduce([p.queue for p in panes])
        p50, p95, p99 = quantiles(e2e)
        s50, s95, s99 = quantiles(service)
        return WindowStats(
            model="m",
            version=self.version,
            variant="fp32",
            window_start_ms=start_ms,
            window_end_ms=end_ms,
            requests=requests,
            errors=sum(p.errors for p in panes),
            p50_ms=p50,
            p95_ms=p95,
            p99_ms=p99,
            mean_ms=float(e2e @ _REP) / requests,
            throughput_rps=requests / (n_panes * STEP_MS / 1000),
            queue_wait_mean_ms=float(queue @ _REP) / requests,
            queue_wait_p99_ms=quantiles(queue)[2],
            batches=len(panes),
            service_p50_ms=s50,
            service_p95_ms=s95,
            service_p99_ms=s99,
            service=histogram(service),
            generation=_generation_stats(panes, requests),
        )


@dataclass(frozen=True)
class _Harm:
    """What a harmful candidate does to the panes it serves, from its onset on."""

    tail: float = 1.0
    """Factor on the slowest 10 % of service times (z above the 90th percentile)."""
    service: float = 1.0
    """Factor on every service time."""
    errors: float = 0.0
    """Added to the error probability."""
    prefill: float = 1.0
    tpot: float = 1.0
    length: float = 1.0
    """Factor on the length each generation would reach by itself."""


_NO_HARM = _Harm()
_HARM: dict[Scenario, _Harm] = {
    Scenario.P99_X15: _Harm(tail=1.5),
    Scenario.SERVICE_X13: _Harm(service=1.3),
    Scenario.SERVICE_X15: _Harm(service=1.5),
    Scenario.ERRORS_1PP: _Harm(errors=0.01),
    Scenario.ERRORS_5PP: _Harm(errors=0.05),
    Scenario.GEN_TTFT_X15: _Harm(prefill=1.5),
    Scenario.GEN_TPOT_X13: _Harm(tpot=1.3),
    Scenario.GEN_LENGTH_X2: _Harm(length=2.0),
}
"""Scenarios whose harm is a fixed factor; ``BACKLOG`` and ``DEAD`` act on the queue and
the liveness instead (in :func:`_pane` and :func:`simulate`)."""


@dataclass(frozen=True)
class _Draw:
    """One pane to draw: its size, the side that serves it, when it ends, the load."""

    n: int
    scenario: Scenario
    candidate: bool
    end_ms: int
    load: float

    @property
    def harm(self) -> _Harm:
        """The candidate's harm once the scenario's onset has passed; none otherwise."""
        if not self.candidate or (self.end_ms - STEP_MS) / 1000 < self.scenario.onset_s:
            return _NO_HARM
        return _HARM.get(self.scenario, _NO_HARM)


def _stalled(rng: np.random.Generator, n: int) -> tuple[np.ndarray, float] | None:
    """A stall (with probability ``BURST_P``): the requests it hits and its slow-down."""
    if not (rng.random() < BURST_P and n):
        return None
    hit = rng.random(n) < rng.uniform(0.05, 0.2)
    return hit, float(rng.uniform(2.0, 4.0))


def _pane(rng: np.random.Generator, d: _Draw) -> _Pane:
    t_s = (d.end_ms - STEP_MS) / 1000
    z = rng.standard_normal(d.n)
    service = MEDIAN_MS * d.load * np.exp(SIGMA * z)
    stall = _stalled(rng, d.n)
    if stall is not None:
        service[stall[0]] *= stall[1]
    queue = rng.exponential(QUEUE_MEAN_MS, d.n)
    harm = d.harm
    service[z > 1.2816] *= harm.tail
    service *= harm.service
    if d.candidate and d.scenario is Scenario.BACKLOG and t_s >= d.scenario.onset_s:
        queue += max(0.0, 1500.0 * (1.0 - t_s / 45.0)) * rng.uniform(0.7, 1.0, d.n)
    return _Pane(
        end_ms=d.end_ms,
        requests=d.n,
        errors=int(rng.binomial(d.n, BASE_ERROR + harm.errors)),
        e2e=bucket_counts(service + queue),
        service=bucket_counts(service),
        queue=bucket_counts(queue),
    )


def _generation_pane(rng: np.random.Generator, d: _Draw) -> _Pane:
    n = d.n
    prefill = GEN_PREFILL_MS * d.load * np.exp(GEN_PREFILL_SIGMA * rng.standard_normal(n))
    tpot = GEN_TPOT_MS * d.load * np.exp(GEN_TPOT_SIGMA * rng.standard_normal(n))
    stall = _stalled(rng, n)
    if stall is not None:  # a stall slows some generations, every step of them
        prefill[stall[0]] *= stall[1]
        tpot[stall[0]] *= stall[1]
    natural = np.maximum(
        1.0, np.round(GEN_LENGTH_MEDIAN * np.exp(GEN_LENGTH_SIGMA * rng.standard_normal(n)))
    )
    harm = d.harm
    prefill *= harm.prefill
    tpot *= harm.tpot
    natural *= harm.length
    tokens = np.minimum(natural, GEN_MAX_TOKENS)
    queue = rng.exponential(QUEUE_MEAN_MS, n)
    service = prefill + tpot * (tokens - 1.0)
    return _Pane(
        end_ms=d.end_ms,
        requests=n,
        errors=int(rng.binomial(n, BASE_ERROR)),
        e2e=bucket_counts(queue + service),
        service=bucket_counts(service),
        queue=bucket_counts(queue),
        generations=_Generations(
            ttft=bucket_counts(queue + prefill),
            tpot=bucket_counts(tpot[tokens > 1]),
            prefill=bucket_counts(prefill),
            lengths=bucket_counts(tokens),
            tokens=int(tokens.sum()),
            ended_by_model=int((natural <= GEN_MAX_TOKENS).sum()),
        ),
    )


def _any_pane(
    rng: np.random.Generator, n: int, scenario: Scenario, candidate: bool, end_ms: int, load: float
) -> _Pane:
    make = _generation_pane if scenario.generative else _pane
    return make(rng, _Draw(n, scenario, candidate, end_ms, load))


def bench_spec(mode: GateMode) -> RolloutSpec:
    return RolloutSpec(
        rollout_id="bench",
        model="m",
        baseline="v1",
        candidate="v2",
        steps=BENCH_STEPS,
        gates=Gates(mode=mode),
    )


def simulate(scenario: Scenario, mode: GateMode, cand_rps: float, seed: int) -> RunResult:
    """One rollout; ``cand_rps`` is the candidate's request rate at the first step."""
    rng = np.random.default_rng(seed)
    total_rps = cand_rps * 100.0 / FIRST_WEIGHT
    spec = bench_spec(mode)
    decision: Decision = start(spec, 0)
    base, cand = _Side("v1"), _Side("v2")
    routed_after_death = 0
    first_routed_after_death: int | None = None
    lag, committed = 0, 0
    lag_samples: list[LagSample] = []
    onset_ms = int(scenario.onset_s * 1000)
    backlog_at: float | None = None
    drift_at: float | None = None
    ticks = int(HORIZON_S * 1000 / STEP_MS)
    for tick in range(1 - PANES, 1):  # the baseline served everything before the rollout
        n = int(rng.poisson(total_rps * STEP_MS / 1000))
        base.panes.append(_any_pane(rng, n, scenario, False, tick * STEP_MS, 1.0))
    for tick in range(1, ticks + 1):
        now = tick * STEP_MS
        share = decision.after.candidate_weight_percent / 100.0
        load = float(np.exp(rng.normal(0.0, 0.05)))
        n_b = int(rng.poisson(total_rps * (1 - share) * STEP_MS / 1000))
        n_c = int(rng.poisson(total_rps * share * STEP_MS / 1000))
        base.panes.append(_any_pane(rng, n_b, scenario, False, now, load))
        dead = scenario is Scenario.DEAD and now > onset_ms
        if dead:
            routed_after_death += n_c
            if first_routed_after_death is None and n_c:
                first_routed_after_death = onset_ms + 1
            lag += n_c
        else:
            cand.panes.append(_any_pane(rng, n_c, scenario, True, now, load))
            committed += n_c
            lag = int(rng.integers(0, 8))
        lag_samples = [*lag_samples[-9:], LagSample(now, lag, committed)]
        signals = RolloutSignals(
            baseline_step=base.stats(now, 1),
            candidate_step=cand.stats(now, 1),
            baseline_liveness=VersionLiveness(version="v1", last_telemetry_ms=now),
            candidate_liveness=VersionLiveness(
                version="v2",
                routed_since_telemetry=routed_after_death,
                first_routed_since_telemetry_ms=first_routed_after_death,
                last_telemetry_ms=onset_ms if dead else now,
                lag=tuple(lag_samples),
            ),
        )
        # A dead candidate's last panes age out of the window as the policy engine's do.
        decision = evaluate(
            decision.after,
            spec,
            base.stats(now, PANES),
            cand.stats(now, PANES),
            None,
            now,
            signals=signals,
        )
        if decision.rule == DecisionRule.CANDIDATE_BACKLOG and backlog_at is None:
            backlog_at = now / 1000 - scenario.onset_s
        if decision.rule == DecisionRule.OUTPUT_LENGTH_DRIFT and drift_at is None:
            drift_at = now / 1000 - scenario.onset_s
        if decision.kind is DecisionKind.ROLLBACK:
            return RunResult(True, False, now / 1000 - scenario.onset_s, decision.rule, drift_at)
        if decision.kind is DecisionKind.PROMOTE:
            return RunResult(False, True, backlog_at, decision.rule, drift_at)
    return RunResult(False, False, backlog_at, decision.rule, drift_at)
