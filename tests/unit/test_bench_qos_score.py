"""bench qos scoring: goodput over all requests, admitted p99, time back to the top rung."""

from __future__ import annotations

import pytest

from graylane.app.bench.qos_score import RequestOutcome, score, seconds_to_top


def test_goodput_counts_every_request_submitted_in_the_span() -> None:
    sent = {f"r{i}": float(i) for i in range(10)}
    answers = {
        "r0": RequestOutcome(True, "", 50.0),
        "r1": RequestOutcome(True, "", 90.0),
        "r2": RequestOutcome(True, "", 150.0),  # OK but late
        "r3": RequestOutcome(False, "SHED", 1.0),
        "r4": RequestOutcome(False, "ENGINE_ERROR", 5.0),
        "r5": RequestOutcome(True, "", 10.0),
        # r6 never answered; r7..r9 outside the span
        "r7": RequestOutcome(True, "", 10.0),
    }
    s = score(sent, answers, start=0.0, end=7.0, slo_ms=100.0)
    assert (s.requests, s.shed, s.errors, s.unanswered) == (7, 1, 1, 1)
    assert s.goodput == pytest.approx(3 / 7)
    assert 90.0 < s.p99_admitted_ms <= 150.0


def test_empty_span() -> None:
    s = score({}, {}, start=0.0, end=1.0, slo_ms=100.0)
    assert (s.requests, s.goodput, s.p99_admitted_ms) == (0, 0.0, 0.0)


def test_seconds_to_top() -> None:
    down_up = [(10.0, "int8"), (55.0, "fp32")]
    assert seconds_to_top(down_up, "fp32", spike_end=50.0) == pytest.approx(5.0)
    assert seconds_to_top([], "fp32", spike_end=50.0) == 0.0
    assert seconds_to_top([(10.0, "int8")], "fp32", spike_end=50.0) is None
    # back up before the spike ended, down again, up after it: the last return counts
    flap = [(10.0, "int8"), (30.0, "fp32"), (35.0, "int8"), (70.0, "fp32")]
    assert seconds_to_top(flap, "fp32", spike_end=50.0) == pytest.approx(20.0)
    # repeated announcements of the same variant do not move the time
    assert seconds_to_top([(10.0, "int8"), (52.0, "fp32"), (60.0, "fp32")], "fp32", 50.0) == 2.0


def test_bench_and_demo_policies_step_up_by_calibrated_capacity() -> None:
    from graylane.app.bench.qos import qos_policy
    from graylane.app.demo.qos_act import qos_act_policy
    from graylane.rollouts.pb import qos_policy_from_pb

    capacities = {"fp32": 21.0, "int8-dynamic": 30.0}
    for pb in (qos_policy(235.0, capacities), qos_act_policy(21.0, 1500.0)):
        policy = qos_policy_from_pb(pb)
        assert policy.capacity_of("fp32") == 21.0
        assert policy.up_capacity_fraction == 0.7
    assert qos_policy_from_pb(qos_act_policy(0.0, 1500.0)).rung_capacity_rps == ()


def test_timeline_slices_score_their_own_requests() -> None:
    from graylane.app.bench.qos_score import timeline

    sent = {f"r{i}": float(i) for i in range(10)}
    answers = {f"r{i}": RequestOutcome(True, "", 50.0) for i in range(5)}
    answers |= {"r5": RequestOutcome(False, "SHED", 1.0), "r6": RequestOutcome(True, "", 500.0)}
    slices = timeline(sent, answers, start=0.0, end=10.0, slo_ms=100.0, width_s=5.0)
    assert [s.start_s for s in slices] == [0.0, 5.0]
    first, second = (s.score for s in slices)
    assert (first.requests, first.good, first.late, first.shed) == (5, 5, 0, 0)
    assert (second.requests, second.good, second.late, second.shed) == (5, 0, 1, 1)
    assert second.unanswered == 3
    with pytest.raises(ValueError):
        timeline(sent, answers, start=0.0, end=1.0, slo_ms=100.0, width_s=0.0)


def test_generations_are_good_on_ttft_and_tpot_however_long_their_answer() -> None:
    from graylane.app.bench.qos_score import GenerationSlo

    slo = GenerationSlo(ttft_ms=500.0, tpot_ms=50.0)
    sent = {f"g{i}": float(i) for i in range(6)}
    answers = {
        "g0": RequestOutcome(True, "", 9000.0, ttft_ms=200.0, tpot_ms=30.0),  # long answer: good
        "g1": RequestOutcome(True, "", 800.0, ttft_ms=700.0, tpot_ms=10.0),  # first token late
        "g2": RequestOutcome(True, "", 3000.0, ttft_ms=100.0, tpot_ms=60.0),  # slow tokens
        "g3": RequestOutcome(True, "", 120.0, ttft_ms=120.0, tpot_ms=0.0),  # one token: good
        "g4": RequestOutcome(False, "SHED", 2.0),
        "g5": RequestOutcome(True, "", 100.0, ttft_ms=0.0, tpot_ms=5.0),  # no TTFT: not good
    }
    s = score(sent, answers, start=0.0, end=6.0, slo_ms=0.0, generation=slo)
    assert (s.requests, s.good, s.shed) == (6, 2, 1)
    assert s.goodput == pytest.approx(2 / 6)
    assert 200.0 < s.ttft_p99_ms <= 700.0 and 30.0 < s.tpot_p99_ms <= 60.0
    # the same answers judged on whole-request latency (1 s) would count g1, g3, g5
    by_latency = score(sent, answers, start=0.0, end=6.0, slo_ms=1000.0)
    assert by_latency.good == 3 and by_latency.ttft_p99_ms == 0.0
    # both stated: a long answer misses the whole-request objective
    both = score(sent, answers, start=0.0, end=6.0, slo_ms=1000.0, generation=slo)
    assert both.good == 1


def test_the_generative_bench_policy_states_ttft_and_tpot_only() -> None:
    from graylane.app.bench.qos import CHAT_MODEL, generative_qos_policy
    from graylane.policy_engine.logic.qos import waiting_limit
    from graylane.rollouts.pb import qos_policy_from_pb

    policy = qos_policy_from_pb(
        generative_qos_policy(300.0, 30.0, {"fp32": 10.0, "int8-dynamic": 20.0})
    )
    assert policy.model == CHAT_MODEL and policy.generative
    assert (policy.slo_p99_ms, policy.slo_ttft_p99_ms, policy.slo_tpot_p99_ms) == (0, 300, 30)
    assert policy.objectives == "TTFT p99 300 ms, TPOT p99 30 ms"
    # 10 generations/s drain 3 waiting sequences within the 300 ms TTFT objective
    assert waiting_limit(policy, "fp32") == pytest.approx(3.0)
