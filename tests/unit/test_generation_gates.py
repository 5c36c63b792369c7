"""Gates for generations: TTFT and TPOT instead of whole-request latency, output-length
drift as a quality signal with its policy, and shadow agreement that says whether it
compared greedy or same-seed token sequences.

Simulated claims (the traffic of ``graylane bench decisions``, seeded): TPOT x1.3 and
TTFT x1.5 are rolled back on their own rules within 10 s; answers twice as long at the
same per-token speed are never rolled back on latency and are reported as drift;
healthy heavy-tailed generations are promoted.
"""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graylane.app.bench.decisions_sim import LATENCY_RULES, Scenario, simulate
from graylane.engine_worker.faults import FaultInjection, FaultyEngine, extends_cache
from graylane.engine_worker.wire import decoding_of
from graylane.histogram import LatencyHistogram
from graylane.policy_engine.logic.agreement import (
    AgreementStats,
    AgreementTracker,
    ShadowOutput,
    TokenDecoding,
)
from graylane.policy_engine.logic.gates import (
    LENGTH_MIN_GENERATIONS,
    SequentialEvidence,
    StepEvidence,
    Verdict,
    advance_sequential,
    agreement_gate,
    generation_latency_gates,
    length_drift_gate,
)
from graylane.policy_engine.logic.rollout import judge
from graylane.policy_engine.logic.window import GenerationStats, WindowStats
from graylane.policy_engine.wire import (
    agreement_from_pb,
    sequential_from_pb,
    sequential_to_pb,
    shadow_output_of,
)
from graylane.rollouts.errors import InvalidSpec
from graylane.rollouts.pb import rollout_spec_from_pb, rollout_spec_to_pb
from graylane.rollouts.spec import DriftAction, GateMode, Gates, RolloutSpec
from graylane.rollouts.vocabulary import DecisionRule
from graylane.v1 import inference_pb2, rollout_pb2

SEEDS = range(8)


# --- simulated rollouts ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("scenario", "rule"),
    [
        (Scenario.GEN_TPOT_X13, DecisionRule.TPOT_SEQUENTIAL),
        (Scenario.GEN_TTFT_X15, DecisionRule.TTFT_SEQUENTIAL),
    ],
)
def test_slower_tokens_are_rolled_back_on_their_own_rule_within_10_s(
    scenario: Scenario, rule: DecisionRule
) -> None:
    runs = [simulate(scenario, GateMode.SEQUENTIAL, 50.0, seed) for seed in SEEDS]
    assert all(r.rolled_back and r.rule == rule for r in runs), runs
    assert max(r.detect_s or 99.0 for r in runs) <= 10.0


def test_longer_answers_are_never_a_latency_rollback_and_are_reported_as_drift() -> None:
    runs = [simulate(Scenario.GEN_LENGTH_X2, GateMode.SEQUENTIAL, 50.0, seed) for seed in SEEDS]
    assert not [r for r in runs if r.rolled_back and r.rule in LATENCY_RULES], runs
    assert all(r.drift_s is not None and r.drift_s <= 10.0 for r in runs), runs
    assert not any(r.promoted for r in runs)  # the default policy holds on a drift


def test_healthy_heavy_tailed_generations_are_promoted() -> None:
    runs = [simulate(Scenario.GEN_HEALTHY, GateMode.SEQUENTIAL, 50.0, seed) for seed in SEEDS]
    assert all(r.promoted and r.drift_s is None for r in runs), runs


# --- the drift gate -------------------------------------------------------------------


def _gen(
    lengths: list[int],
    *,
    ended: int | None = None,
    ttft: list[float] | None = None,
    tpot: list[float] | None = None,
    prefill: list[float] | None = None,
) -> GenerationStats:
    hist = LatencyHistogram.of(float(n) for n in lengths)
    return GenerationStats(
        generations=len(lengths),
        ttft=LatencyHistogram.of(ttft or [50.0] * len(lengths)),
        tpot=LatencyHistogram.of(tpot or [10.0] * len(lengths)),
        inter_token_p99=LatencyHistogram(),
        prefill=LatencyHistogram.of(prefill or []),
        output_tokens=hist,
        generated_tokens=sum(lengths),
        ended_by_model=len(lengths) if ended is None else ended,
    )


def _stats(version: str, gen: GenerationStats | None, *, queue_p99: float = 3.0) -> WindowStats:
    n = gen.generations if gen is not None else 100
    return WindowStats(
        model="m",
        version=version,
        variant="fp32",
        window_start_ms=0,
        window_end_ms=10_000,
        requests=n,
        errors=0,
        p50_ms=500.0,
        p95_ms=900.0,
        p99_ms=1000.0,
        mean_ms=500.0,
        throughput_rps=n / 10,
        queue_wait_p99_ms=queue_p99,
        generation=gen,
    )


def _lengths(rng: np.random.Generator, n: int, scale: float = 1.0) -> list[int]:
    return [max(1, round(60 * scale * x)) for x in np.exp(0.9 * rng.standard_normal(n))]


@pytest.mark.parametrize(
    ("action", "verdict"),
    [
        (DriftAction.REPORT, Verdict.PASS),
        (DriftAction.HOLD, Verdict.INCONCLUSIVE),
        (DriftAction.ROLLBACK, Verdict.FAIL),
    ],
)
def test_a_length_drift_does_what_the_policy_says(action: DriftAction, verdict: Verdict) -> None:
    rng = np.random.default_rng(1)
    base = _stats("v1", _gen(_lengths(rng, 300)))
    cand = _stats("v2", _gen(_lengths(rng, 300, 2.0)))
    result = length_drift_gate(base, cand, Gates(length_drift=action))
    assert result.rule is DecisionRule.OUTPUT_LENGTH_DRIFT
    assert result.verdict is verdict and result.drifted is (action is DriftAction.REPORT)
    assert result.detail.startswith("drift: output tokens mean") and not result.severe


def test_an_eos_rate_change_alone_is_a_drift() -> None:
    lengths = _lengths(np.random.default_rng(2), 300)
    base = _stats("v1", _gen(lengths, ended=280))
    cand = _stats("v2", _gen(lengths, ended=150))
    result = length_drift_gate(base, cand, Gates())
    assert result.verdict is Verdict.INCONCLUSIVE and "ended by the model" in result.detail


def test_too_few_generations_are_not_judged_for_drift() -> None:
    few = LENGTH_MIN_GENERATIONS - 1
    base = _stats("v1", _gen([10] * few))
    cand = _stats("v2", _gen([100] * few))
    assert length_drift_gate(base, cand, Gates()).verdict is Verdict.PASS


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 2000), min_size=LENGTH_MIN_GENERATIONS, max_size=400),
    ended_share=st.floats(0.0, 1.0),
)
def test_identical_generations_never_drift(lengths: list[int], ended_share: float) -> None:
    gen = _gen(lengths, ended=round(ended_share * len(lengths)))
    result = length_drift_gate(_stats("v1", gen), _stats("v2", gen), Gates())
    assert result.verdict is Verdict.PASS and not result.drifted


@settings(max_examples=60, deadline=None)
@given(
    base=st.lists(st.integers(1, 500), min_size=LENGTH_MIN_GENERATIONS, max_size=300),
    cand=st.lists(st.integers(1, 500), min_size=LENGTH_MIN_GENERATIONS, max_size=300),
    shift=st.floats(0.05, 0.5),
)
def test_a_drift_verdict_needs_a_shift_beyond_the_tolerance(
    base: list[int], cand: list[int], shift: float
) -> None:
    b, c = _gen(base), _gen(cand)
    result = length_drift_gate(_stats("v1", b), _stats("v2", c), Gates(max_length_shift=shift))
    if result.verdict is not Verdict.PASS:
        bucket = b.output_tokens.bucket_index(b.output_tokens.quantile(0.5))

        def share(g: GenerationStats) -> float:
            above = sum(n for i, n in g.output_tokens.buckets.items() if i > bucket)
            return above / g.output_tokens.count

        assert abs(share(c) - share(b)) > shift


# --- latency gates for generations ----------------------------------------------------


def test_fixed_mode_judges_ttft_and_tpot_not_whole_requests() -> None:
    rng = random.Random(3)
    n = 400
    ttft = [rng.lognormvariate(4.0, 0.3) for _ in range(n)]
    tpot = [rng.lognormvariate(3.0, 0.15) for _ in range(n)]
    base = _stats("v1", _gen([60] * n, ttft=ttft, tpot=tpot))
    slow_tpot = _stats("v2", _gen([60] * n, ttft=ttft, tpot=[t * 1.8 for t in tpot]))
    results = generation_latency_gates(base, slow_tpot, Gates(mode=GateMode.FIXED))
    by_rule = {r.rule: r for r in results}
    assert by_rule[DecisionRule.TTFT_P99_RATIO].verdict is Verdict.PASS
    assert by_rule[DecisionRule.TPOT_P99_RATIO].verdict is Verdict.FAIL
    # Whole-request latency 5x worse, token times the same: nothing fails.
    long = replace(base, version="v2", p50_ms=2500.0, p95_ms=4500.0, p99_ms=5000.0)
    assert all(
        r.verdict is Verdict.PASS
        for r in generation_latency_gates(base, long, Gates(mode=GateMode.FIXED))
    )


def test_ttft_is_judged_as_served_and_a_queue_never_fails_it() -> None:
    n = 200
    served = [20.0 + (i % 7) for i in range(n)]
    base = _stats("v1", _gen([60] * n, ttft=[s + 5.0 for s in served], prefill=served))
    # The candidate's first tokens wait in a queue (TTFT x4 from creation) but are
    # served as fast: capacity, not a regression.
    queued = _stats(
        "v2",
        _gen([60] * n, ttft=[s + 300.0 for s in served], prefill=served),
        queue_p99=320.0,
    )
    gates = Gates(mode=GateMode.FIXED)
    results = judge(base, queued, StepEvidence(), SequentialEvidence(), gates)
    rules = {r.rule: r.verdict for r in results}
    assert rules[DecisionRule.CANDIDATE_BACKLOG] is Verdict.INCONCLUSIVE
    assert rules.get(DecisionRule.TTFT_P99_RATIO, Verdict.PASS) is Verdict.PASS
    assert results[0].rule is DecisionRule.OUTPUT_LENGTH_DRIFT  # judged first
    # Without a backlog, a served TTFT x1.8 fails.
    slow = _stats("v2", _gen([60] * n, prefill=[s * 1.8 for s in served]))
    failed = [r for r in judge(base, slow, StepEvidence(), SequentialEvidence(), gates)]
    assert {r.rule for r in failed if r.verdict is Verdict.FAIL} == {DecisionRule.TTFT_P99_RATIO}


# --- configuration and state on the wire -----------------------------------------------


def test_generation_gate_settings_travel_with_the_spec() -> None:
    spec = RolloutSpec(
        rollout_id="r",
        model="m",
        baseline="v1",
        candidate="v2",
        gates=Gates(
            length_drift=DriftAction.ROLLBACK,
            max_length_shift=0.2,
            max_eos_rate_delta=0.05,
            token_time_tolerance=0.0,
        ),
    )
    back = rollout_spec_from_pb(rollout_spec_to_pb(spec))
    assert back.gates == spec.gates
    default = rollout_spec_from_pb(
        rollout_pb2.RolloutSpec(
            rollout_id="r", model="m", baseline_version="a", candidate_version="b"
        )
    )
    assert default.gates.length_drift is DriftAction.HOLD
    assert (default.gates.max_length_shift, default.gates.token_time_tolerance) == (0.15, 0.1)
    with pytest.raises(InvalidSpec, match="max_length_shift"):
        replace(spec, gates=Gates(max_length_shift=1.5))
    unknown = rollout_spec_to_pb(spec)
    unknown.gates.length_drift = 42  # type: ignore[assignment]
    with pytest.raises(InvalidSpec, match="drift action 42"):
        rollout_spec_from_pb(unknown)


def test_the_generation_tests_survive_a_restart() -> None:
    rng = np.random.default_rng(4)
    ev = SequentialEvidence()
    gates = Gates()
    for k in range(4):
        base = _stats("v1", _gen(_lengths(rng, 100), tpot=list(10.0 + rng.random(100))))
        cand = _stats("v2", _gen(_lengths(rng, 100), tpot=list(14.0 + rng.random(100))))
        window = (k * 2000, k * 2000 + 2000)
        base = replace(base, window_start_ms=window[0], window_end_ms=window[1])
        cand = replace(cand, window_start_ms=window[0], window_end_ms=window[1])
        ev = advance_sequential(ev, gates, base, cand)
    assert ev.tpot.p95.candidate_events > 0 and ev.tpot.baseline_p95_ms
    pb = rollout_pb2.RolloutState()
    encoded = sequential_to_pb(ev)
    assert encoded is not None
    pb.sequential.CopyFrom(encoded)
    assert sequential_from_pb(pb) == ev


# --- agreement -------------------------------------------------------------------------


def _answer(pair: str, version: str, tokens: tuple[int, ...], way: TokenDecoding | None):
    return ShadowOutput(
        request_id=pair, version=version, at_ms=1, tokens=tokens, pair_id=pair, decoding=way
    )


def test_agreement_on_generations_says_greedy_or_same_seed_and_skips_unseeded() -> None:
    tracker = AgreementTracker("v1", "v2")
    cases = [
        ("g1", TokenDecoding.GREEDY, TokenDecoding.GREEDY, (1, 2), (1, 2)),
        ("g2", TokenDecoding.GREEDY, TokenDecoding.GREEDY, (1, 2), (1, 3)),
        ("s1", TokenDecoding.SEEDED, TokenDecoding.SEEDED, (4,), (4,)),
        ("u1", TokenDecoding.UNSEEDED, TokenDecoding.UNSEEDED, (5,), (6,)),
        ("u2", TokenDecoding.GREEDY, TokenDecoding.UNSEEDED, (5,), (5,)),
    ]
    for pair, wb, wc, tb, tc in cases:
        tracker.add(_answer(pair, "v1", tb, wb))
        tracker.add(_answer(pair, "v2", tc, wc))
    stats = tracker.stats()
    assert (stats.pairs, stats.agreeing) == (3, 2)
    assert (stats.greedy, stats.seeded, stats.unseeded) == (2, 1, 2)
    assert stats.basis == (
        "token sequences: 2 under greedy decoding, 1 under the same seed; "
        "2 sampled without a seed not compared"
    )
    result = agreement_gate(stats, Gates())
    assert "under greedy decoding" in result.detail
    assert stats.merge(stats).unseeded == 4
    from graylane.policy_engine.wire import _agreement_to_pb

    assert agreement_from_pb(_agreement_to_pb(stats)) == stats


def test_results_say_how_their_tokens_were_chosen() -> None:
    greedy = inference_pb2.GenerationParams()
    seeded = inference_pb2.GenerationParams(temperature=0.8, seed=7, has_seed=True)
    unseeded = inference_pb2.GenerationParams(temperature=0.8)
    assert decoding_of(greedy) == inference_pb2.GREEDY
    assert decoding_of(seeded) == inference_pb2.SEEDED
    assert decoding_of(unseeded) == inference_pb2.UNSEEDED
    pb = inference_pb2.InferenceResult(
        request_id="r", version="v2", generated_token_ids=[3, 4], decoding=inference_pb2.SEEDED
    )
    assert shadow_output_of(pb, 5).decoding is TokenDecoding.SEEDED
    pb.decoding = inference_pb2.DECODING_UNSPECIFIED  # an older worker: compared as is
    assert shadow_output_of(pb, 5).decoding is None
    with pytest.raises(ValueError, match="decoding counts"):
        AgreementStats(1, 1, greedy=2)


# --- the decode-step fault -------------------------------------------------------------


class _Engine:
    name = "e"
    variant = "fp32"
    io = None

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {}

    def close(self) -> None:
        pass


def test_the_decode_step_fault_slows_decode_steps_only() -> None:
    slept: list[float] = []
    engine = FaultyEngine(
        _Engine(),  # type: ignore[arg-type]
        FaultInjection(decode_step_latency_ms=15.0),
        random.Random(0),
        sleep=slept.append,
    )
    prefill = {
        "input_ids": np.zeros((2, 5), np.int64),
        "past_key_values.0.key": np.zeros((2, 4, 0, 8), np.float32),
    }
    decode = {
        "input_ids": np.zeros((2, 1), np.int64),
        "past_key_values.0.key": np.zeros((2, 4, 5, 8), np.float32),
    }
    assert not extends_cache(prefill) and extends_cache(decode)
    assert not extends_cache({"input_ids": np.zeros((1, 4), np.int64)})
    engine.run(prefill)
    assert slept == []
    engine.run(decode)
    assert slept == [pytest.approx(0.015)]


def test_generations_without_token_times_are_judged_on_service_time_as_before() -> None:
    """Generation run per batch (no continuous decode loop) stamps no token times."""
    n = 100
    no_times = GenerationStats(
        generations=n,
        ttft=LatencyHistogram(),
        tpot=LatencyHistogram(),
        inter_token_p99=LatencyHistogram(),
        prefill=LatencyHistogram(),
        output_tokens=LatencyHistogram.of([30.0] * n),
        generated_tokens=30 * n,
        ended_by_model=n,
    )
    base, cand = _stats("v1", no_times), _stats("v2", no_times)
    rules = [r.rule for r in judge(base, cand, StepEvidence(), SequentialEvidence(), Gates())]
    assert rules[0] is DecisionRule.OUTPUT_LENGTH_DRIFT
    assert DecisionRule.TTFT_SEQUENTIAL not in rules
    assert DecisionRule.P99_RATIO in rules or DecisionRule.SERVICE_TIME_SEQUENTIAL in rules


def test_rollout_start_carries_the_drift_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from graylane.app.cli import rollouts
    from graylane.app.cli.main import main

    sent: list[rollout_pb2.RolloutSpec] = []

    def call(
        args: object, stub: str, method: str, request: rollout_pb2.RolloutSpec
    ) -> rollout_pb2.RolloutState:
        sent.append(request)
        return rollout_pb2.RolloutState(rollout_id="r", model=request.model, spec=request)

    monkeypatch.setattr(rollouts, "call", call)
    monkeypatch.setattr(rollouts, "print_state", lambda state: None)
    common = ["rollout", "start", "--model", "m", "--candidate", "v2", "--baseline", "v1"]
    assert main([*common, "--length-drift", "rollback", "--max-length-shift", "0.2"]) == 0
    assert main(common) == 0
    given_, default = (rollout_spec_from_pb(replace_id(s)) for s in sent)
    assert given_.gates.length_drift is DriftAction.ROLLBACK
    assert given_.gates.max_length_shift == 0.2 and given_.gates.max_eos_rate_delta == 0.1
    assert default.gates.length_drift is DriftAction.HOLD


def replace_id(spec: rollout_pb2.RolloutSpec) -> rollout_pb2.RolloutSpec:
    spec.rollout_id = spec.rollout_id or "r"  # the control plane names it
    return spec
