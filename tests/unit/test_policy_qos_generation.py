"""QoS and scale on LLM SLOs: TTFT/TPOT objectives, waiting sequences and KV-cache occupancy.

A generation's whole-request latency is mostly its output length, so a generative
policy steps down on TTFT p99 and TPOT p99 (and on the decode loop's load
signals), never on a long answer; the waiting-sequences limit comes from the
rung's measured capacity and the TTFT objective, and every figure is reported
against the Gateway API Inference Extension's defaults (queue depth 5, KV 0.8).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graylane.histogram import LatencyHistogram
from graylane.policy_engine.logic.qos import (
    QosDecision,
    QosDecisionKind,
    QosState,
    breach_rule,
    evaluate_qos,
    initial_qos_state,
    waiting_limit,
)
from graylane.policy_engine.logic.scale import (
    ScaleDecisionKind,
    ScalePolicy,
    ScaleReason,
    ScaleSignals,
    ScaleState,
    evaluate_scale,
)
from graylane.policy_engine.logic.window import GenerationStats, WindowStats
from graylane.rollouts.errors import InvalidPolicy
from graylane.rollouts.qos_policy import QosPolicy
from graylane.rollouts.vocabulary import DecisionRule
from tests.support.window_stats import window_stats

GEN = QosPolicy(
    model="m",
    version="v1",
    slo_p99_ms=0.0,
    slo_ttft_p99_ms=500.0,
    slo_tpot_p99_ms=50.0,
    ladder=("fp32", "int8-dynamic"),
)
T0 = 1_700_000_000_000


def _hist(value_ms: float, n: int = 200) -> LatencyHistogram:
    h = LatencyHistogram()
    h.record(value_ms, n)
    return h


def gen_window(
    *,
    ttft_ms: float = 100.0,
    tpot_ms: float = 10.0,
    waiting: int = 0,
    kv: float = 0.2,
    workers: int = 1,
    p99_ms: float = 4000.0,
    variant: str = "fp32",
    throughput_rps: float = 5.0,
) -> WindowStats:
    """A window of generations: ``p99_ms`` is the whole-request p99 (long answers)."""
    generation = GenerationStats(
        generations=200,
        ttft=_hist(ttft_ms),
        tpot=_hist(tpot_ms),
        inter_token_p99=_hist(tpot_ms * 2),
        prefill=_hist(ttft_ms / 2),
        output_tokens=_hist(100.0),
        prompt_tokens=200 * 64,
        generated_tokens=200 * 100,
        ended_by_model=150,
        kv_cache_occupancy=kv,
        waiting_sequences=waiting,
    )
    stats = window_stats(p99_ms, variant=variant, throughput_rps=throughput_rps, requests=200)
    return replace(stats, workers=workers, generation=generation)


class Loop:
    def __init__(self, policy: QosPolicy = GEN, state: QosState | None = None) -> None:
        self.policy = policy
        self.state = state or initial_qos_state(policy)
        self.t = T0
        self.decisions: list[QosDecision] = []

    def tick(self, stats: WindowStats | None) -> QosDecision:
        self.t += 1000
        d = evaluate_qos(self.state, self.policy, stats, self.t)
        self.decisions.append(d)
        self.state = d.after
        return d


# -- the policy -----------------------------------------------------------------------------


def test_a_generative_policy_may_leave_whole_request_latency_unjudged() -> None:
    assert GEN.generative and GEN.objectives == "TTFT p99 500 ms, TPOT p99 50 ms"
    assert replace(GEN, slo_tpot_p99_ms=0.0).objectives == "TTFT p99 500 ms"
    assert replace(GEN, slo_p99_ms=9000.0).objectives.startswith("p99 9000 ms, TTFT")
    assert GEN.kv_cache_limit == pytest.approx(0.8)  # the Inference Extension's default
    with pytest.raises(InvalidPolicy):  # no objective at all
        replace(GEN, slo_ttft_p99_ms=0.0, slo_tpot_p99_ms=0.0)


@pytest.mark.parametrize(
    "changes",
    [
        {"slo_ttft_p99_ms": -1.0},
        {"slo_tpot_p99_ms": float("nan")},
        {"max_waiting_sequences": -2.0},
        {"max_kv_cache_occupancy": 1.5},
        {"slo_p99_ms": -5.0},
    ],
)
def test_broken_generative_policies_are_refused(changes: dict[str, object]) -> None:
    with pytest.raises(InvalidPolicy):
        replace(GEN, **changes)  # type: ignore[arg-type]


# -- breaches --------------------------------------------------------------------------------


def test_a_sustained_ttft_breach_steps_down_and_says_so() -> None:
    loop = Loop()
    for _ in range(5):
        d = loop.tick(gen_window(ttft_ms=800.0))
        assert d.kind is QosDecisionKind.HOLD and d.rule == DecisionRule.SUSTAIN
    d = loop.tick(gen_window(ttft_ms=800.0))
    assert (d.kind, d.rule, d.variant) == (
        QosDecisionKind.STEP_DOWN,
        DecisionRule.TTFT_BREACH,
        "int8-dynamic",
    )
    assert "TTFT p99 8" in d.reason and "(SLO 500, down > 600)" in d.reason
    assert "Inference Extension 5" in d.reason and "Inference Extension 0.8" in d.reason


def test_tpot_over_its_objective_breaches_ttft_within_it_does_not() -> None:
    assert breach_rule(gen_window(tpot_ms=70.0), GEN) == DecisionRule.TPOT_BREACH
    assert breach_rule(gen_window(tpot_ms=55.0), GEN) is None  # within the 20 % margin
    assert breach_rule(gen_window(ttft_ms=590.0), GEN) is None


def test_a_long_answer_is_not_a_breach_of_a_generative_slo() -> None:
    """Whole-request p99 of 30 s (long answers) with TTFT and TPOT well in: no breach."""
    long_answers = gen_window(p99_ms=30_000.0)
    assert breach_rule(long_answers, GEN) is None
    # the same window under a latency-only policy of 1 s is a p99 breach
    latency_only = QosPolicy(model="m", version="v1", slo_p99_ms=1000.0, ladder=GEN.ladder)
    assert breach_rule(long_answers, latency_only) == DecisionRule.P99_BREACH
    # stated alongside, whole-request p99 is judged too
    assert breach_rule(long_answers, replace(GEN, slo_p99_ms=1000.0)) == DecisionRule.P99_BREACH


def test_the_waiting_limit_comes_from_measured_capacity_and_the_ttft_objective() -> None:
    calibrated = replace(GEN, rung_capacity_rps=(("fp32", 20.0), ("int8-dynamic", 40.0)))
    # one fp32 worker completes 20 generations/s: 10 waiting drain within 500 ms
    assert waiting_limit(calibrated, "fp32") == pytest.approx(10.0)
    assert waiting_limit(calibrated, "int8-dynamic") == pytest.approx(20.0)
    # in a stack that leaves the rung half its calibrated speed, half as many
    assert waiting_limit(calibrated, "fp32", contention=0.5) == pytest.approx(5.0)
    # no calibration, or no TTFT objective: the Inference Extension's queue depth
    assert waiting_limit(GEN, "fp32") == pytest.approx(5.0)
    assert waiting_limit(replace(calibrated, slo_ttft_p99_ms=0.0), "fp32") == pytest.approx(5.0)
    assert waiting_limit(replace(calibrated, max_waiting_sequences=3.0), "fp32") == 3.0
    # never below one sequence
    slow = replace(GEN, rung_capacity_rps=(("fp32", 0.5),))
    assert waiting_limit(slow, "fp32") == pytest.approx(1.0)


def test_waiting_sequences_are_judged_per_worker() -> None:
    calibrated = replace(GEN, rung_capacity_rps=(("fp32", 20.0), ("int8-dynamic", 40.0)))
    assert breach_rule(gen_window(waiting=18, workers=2), calibrated) is None  # 9 < 10
    assert breach_rule(gen_window(waiting=22, workers=2), calibrated) == DecisionRule.WAITING_BREACH
    # uncalibrated: over the Inference Extension's 5 per worker
    assert breach_rule(gen_window(waiting=5), GEN) is None
    assert breach_rule(gen_window(waiting=6), GEN) == DecisionRule.WAITING_BREACH


def test_kv_cache_occupancy_over_its_limit_breaches() -> None:
    assert breach_rule(gen_window(kv=0.85), GEN) == DecisionRule.KV_CACHE_BREACH
    assert breach_rule(gen_window(kv=0.85), replace(GEN, max_kv_cache_occupancy=0.9)) is None


def test_a_latency_policy_ignores_generation_load_signals() -> None:
    latency_only = QosPolicy(model="m", version="v1", slo_p99_ms=5000.0, ladder=GEN.ladder)
    assert breach_rule(gen_window(kv=0.99, waiting=50, ttft_ms=9000.0), latency_only) is None


# -- calm ------------------------------------------------------------------------------------


def test_calm_generations_step_back_up_without_calibration() -> None:
    loop = Loop(state=QosState(model="m", version="v1", active_variant="int8-dynamic"))
    calm = gen_window(ttft_ms=100.0, tpot_ms=10.0, variant="int8-dynamic")
    decisions = [loop.tick(calm) for _ in range(8)]
    ups = [d for d in decisions if d.kind is QosDecisionKind.STEP_UP]
    assert len(ups) == 1 and ups[0].rule == DecisionRule.GENERATION_CALM
    assert loop.state.active_variant == "fp32"


@pytest.mark.parametrize(
    "busy",
    [
        {"ttft_ms": 400.0},  # under the objective but over 0.6 x 500
        {"tpot_ms": 35.0},
        {"kv": 0.6},  # over 0.6 x 0.8
        {"waiting": 4},  # over 0.6 x 5
    ],
)
def test_any_figure_in_the_band_holds_the_step_up(busy: dict[str, float]) -> None:
    loop = Loop(state=QosState(model="m", version="v1", active_variant="int8-dynamic"))
    window = gen_window(variant="int8-dynamic", **busy)  # type: ignore[arg-type]
    decisions = [loop.tick(window) for _ in range(10)]
    assert {d.rule for d in decisions} == {DecisionRule.WITHIN_BAND}
    assert loop.state.active_variant == "int8-dynamic"


def test_a_window_without_generation_figures_is_neither_breach_nor_calm() -> None:
    loop = Loop(state=QosState(model="m", version="v1", active_variant="int8-dynamic"))
    bare = window_stats(100.0, variant="int8-dynamic")
    decisions = [loop.tick(bare) for _ in range(10)]
    assert {d.rule for d in decisions} == {DecisionRule.WITHIN_BAND}
    assert "no generation figures" in decisions[-1].reason


figures = st.fixed_dictionaries(
    {
        "ttft_ms": st.floats(1.0, 3000.0),
        "tpot_ms": st.floats(0.5, 300.0),
        "waiting": st.integers(0, 40),
        "kv": st.floats(0.0, 1.0),
        "workers": st.integers(1, 4),
        "p99_ms": st.floats(10.0, 60_000.0),
    }
)


@settings(max_examples=150, deadline=None)
@given(figures, st.floats(1.0, 2.0))
def test_worse_figures_never_clear_a_breach(f: dict[str, float], worse: float) -> None:
    """Monotone: TTFT, TPOT, waiting and KV all no better never turns a breach into none."""
    calibrated = replace(GEN, rung_capacity_rps=(("fp32", 20.0),))
    base = gen_window(**f)  # type: ignore[arg-type]
    bad = gen_window(
        **{
            **f,
            "ttft_ms": f["ttft_ms"] * worse,
            "tpot_ms": f["tpot_ms"] * worse,
            "waiting": int(f["waiting"] * worse),
            "kv": min(1.0, f["kv"] * worse),
        }
    )  # type: ignore[arg-type]
    for policy in (GEN, calibrated):
        if breach_rule(base, policy) is not None:
            assert breach_rule(bad, policy) is not None


@settings(max_examples=60, deadline=None)
@given(figures, st.sampled_from(["fp32", "int8-dynamic"]))
def test_constant_figures_never_move_the_ladder_both_ways(f: dict[str, float], start: str) -> None:
    """No flapping: under the same generation figures the controller moves one way only
    (the calm band is strictly inside the breach band for every signal)."""
    loop = Loop(state=QosState(model="m", version="v1", active_variant=start))
    for _ in range(120):
        loop.tick(gen_window(**{**f, "variant": loop.state.active_variant}))  # type: ignore[arg-type]
    kinds = {d.kind for d in loop.decisions if d.changed}
    assert not {QosDecisionKind.STEP_UP, QosDecisionKind.STEP_DOWN} <= kinds


# -- scale -------------------------------------------------------------------------------------

SCALE = ScalePolicy(max_replicas=3, lag_growth_s=10.0, out_dwell_s=15.0, cooldown_s=30.0)


def _signals(**kw: object) -> ScaleSignals:
    base: dict[str, object] = {
        "model": "m",
        "version": "v1",
        "replicas": 1,
        "partitions": 3,
        "variant": "int8-dynamic",
        "throughput_rps": 4.0,
    }
    base.update(kw)
    return ScaleSignals(**base)  # type: ignore[arg-type]


def test_waiting_sequences_growing_behind_a_zero_lag_scale_out() -> None:
    """A generative worker takes its records into its waiting list: the topic's lag stays 0
    while the queue grows in the decode loop; the backlog counts both."""
    state = ScaleState(model="m", version="v1", desired=1)
    decision = None
    for i in range(15):
        decision = evaluate_scale(
            state, SCALE, _signals(lag=0, waiting_sequences=2 + i), T0 + i * 1000
        )
        state = decision.after
        if decision.changed:
            break
    assert decision is not None and decision.kind is ScaleDecisionKind.SCALE_OUT
    assert decision.reason is ScaleReason.LAG_GROWING and "lag + waiting" in decision.detail
    # the lag alone, flat at 0 with the same throughput, never scales out
    flat = ScaleState(model="m", version="v1", desired=1)
    for i in range(15):
        d = evaluate_scale(flat, SCALE, _signals(lag=0), T0 + i * 1000)
        flat = d.after
        assert not d.changed


def test_no_scale_in_while_sequences_wait() -> None:
    known = evaluate_scale(
        ScaleState(model="m", version="v1", desired=1),
        SCALE,
        _signals(floor_breach=True, throughput_rps=10.0),
        T0,
    ).after
    state = replace(known, desired=2, last_change_ms=T0)
    low = _signals(replicas=2, throughput_rps=2.0)  # < 0.5 x 1 replica x 10 gen/s
    waiting = replace(low, waiting_sequences=1)
    held = state
    for i in range(60):
        d = evaluate_scale(held, SCALE, waiting, T0 + 40_000 + i * 1000)
        held = d.after
        assert d.kind is not ScaleDecisionKind.SCALE_IN
    ins = []
    for i in range(60):
        d = evaluate_scale(state, SCALE, low, T0 + 40_000 + i * 1000)
        state = d.after
        ins += [d] if d.kind is ScaleDecisionKind.SCALE_IN else []
    assert len(ins) == 1


def test_a_ceiling_recorded_at_a_jump_is_the_newest_steps_load() -> None:
    """Regression: a 3x spike from 3.6 to 10.8 generations/s breached while the 4 s window's
    average still read 4.0/s; that became fp32's ceiling, and the steady 3.6/s after the
    spike stayed above 0.8 x 4.0, so fp32 never came back. The newest step's offered load
    (10.8/s) is the load the rung could not carry."""
    loop = Loop(replace(GEN, sustain_s=0.0, min_dwell_s=0.0))
    jump = replace(gen_window(waiting=9, throughput_rps=4.0), step_offered_rps=10.8)
    d = loop.tick(jump)
    assert d.kind is QosDecisionKind.STEP_DOWN
    ceiling = d.after.ceiling_of("fp32")
    assert ceiling is not None and ceiling.throughput_rps == pytest.approx(10.8)
    steady = gen_window(variant="int8-dynamic", throughput_rps=3.6)
    up = loop.tick(steady)
    assert (up.kind, up.variant) == (QosDecisionKind.STEP_UP, "fp32"), up.reason


def test_generative_decisions_replay_from_their_audit_copy() -> None:
    """``audit verify`` re-runs QoS from the audited policy and windows: the generative
    objectives and the windows' generation figures survive the protobuf round trip."""
    from graylane.policy_engine.logic.replay import qos_recording_of, replay_qos
    from graylane.policy_engine.wire import window_stats_from_pb, window_stats_to_pb
    from graylane.rollouts.pb import qos_policy_from_pb, qos_policy_to_pb

    policy = replace(GEN, rung_capacity_rps=(("fp32", 20.0), ("int8-dynamic", 40.0)))
    loop = Loop(policy)
    for i in range(90):
        spike = 20 <= i < 50
        loop.tick(
            gen_window(
                ttft_ms=700.0 if spike else 90.0,
                waiting=12 if spike else 0,
                throughput_rps=30.0 if spike else 6.0,
                variant=loop.state.active_variant,
            )
        )
    assert {DecisionRule.TTFT_BREACH, DecisionRule.LOAD_CALM} <= {
        d.rule for d in loop.decisions if d.changed
    }
    audited = [
        replace(d, inputs=tuple(window_stats_from_pb(window_stats_to_pb(w)) for w in d.inputs))
        for d in loop.decisions
    ]
    again = qos_policy_from_pb(qos_policy_to_pb(policy))
    assert again == policy
    replayed = replay_qos(qos_recording_of(again, audited))
    assert [(d.kind, d.rule, d.variant) for d in replayed] == [
        (d.kind, d.rule, d.variant) for d in loop.decisions
    ]
