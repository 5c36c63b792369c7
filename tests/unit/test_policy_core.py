"""PolicyCore without a broker: commands and telemetry in, publications out."""

from __future__ import annotations

from dataclasses import replace

from graylane.histogram import LatencyHistogram
from graylane.policy_engine import wire
from graylane.policy_engine.audit_replay import verify
from graylane.policy_engine.core import PolicyCore
from graylane.policy_engine.logic.window import TelemetrySample
from graylane.policy_engine.messages import (
    Command,
    CommandKind,
    CommandRejected,
    PrecisionPublication,
    QosAudit,
    RolloutAudit,
    RolloutPublication,
    RoutingPublication,
)
from graylane.policy_engine.state import VersionKey
from graylane.policy_engine.wire import command_from_pb, records_of
from graylane.rollouts.pb import rollout_spec_to_pb
from graylane.rollouts.qos_policy import QosPolicy
from graylane.rollouts.spec import RolloutSpec, Step
from graylane.rollouts.vocabulary import ManualCommand, Phase
from graylane.topics import TopicLayout
from graylane.v1 import audit_pb2, control_pb2, rollout_pb2

MODEL = "gpt"
SPEC = RolloutSpec(
    rollout_id="r1",
    model=MODEL,
    baseline="v1",
    candidate="v2",
    steps=(Step(10.0, 10, 2.0), Step(50.0, 10, 2.0), Step(100.0, 0, 0.0)),
)


def batch(
    version: str,
    at_ms: int,
    *,
    n: int = 10,
    errors: int = 0,
    ms: float = 5.0,
    variant: str = "fp32",
) -> TelemetrySample:
    h = LatencyHistogram()
    for _ in range(n):
        h.record(ms)
    return TelemetrySample(
        model=MODEL,
        version=version,
        variant=variant,
        worker_id=f"w-{version}",
        completed_at_ms=at_ms,
        request_count=n,
        error_count=errors,
        latency=h,
    )


def start_cmd(spec: RolloutSpec = SPEC) -> Command:
    return Command(
        kind=CommandKind.START,
        model=spec.model,
        rollout_id=spec.rollout_id,
        spec=spec,
        command_id="c-start",
    )


def drive(core: PolicyCore, t0: int, t1: int, *, bad: bool = False) -> list[object]:
    """Feed telemetry of both versions every 250 ms and tick every second."""
    out: list[object] = []
    for t in range(t0, t1, 250):
        core.on_telemetry(batch("v1", t))
        core.on_telemetry(batch("v2", t, errors=5 if bad else 0, ms=40.0 if bad else 5.0))
        if t % 1000 == 0:
            out.extend(core.tick(t))
    return out


def routing(outputs: list[object]) -> list[RoutingPublication]:
    return [o for o in outputs if isinstance(o, RoutingPublication)]


def audits(outputs: list[object]) -> list[RolloutAudit]:
    return [o for o in outputs if isinstance(o, RolloutAudit)]


def test_healthy_canary_is_promoted_with_rising_epochs() -> None:
    core = PolicyCore(window_ms=4000, step_ms=1000)
    core.restore([], {MODEL: 7}, {})
    out = core.on_command(start_cmd(), 100_000)
    out += drive(core, 100_000, 130_000)
    tables = routing(out)
    assert [t.plan.weight_of("v2") for t in tables] == [10.0, 50.0, 100.0]
    assert [t.plan.epoch for t in tables] == [8, 9, 10]
    assert tables[-1].plan.stable_version == "v2"
    assert MODEL not in core.rollouts and core.rollouts.finished["r1"].phase is Phase.PROMOTED
    # Every state change is published; the last is the promotion.
    states = [o for o in out if isinstance(o, RolloutPublication)]
    assert states[-1].state.phase is Phase.PROMOTED
    # The audit records replay to the same decisions, also via the wire form.
    layout = TopicLayout(prefix="p")
    recs = [
        audit_pb2.AuditRecord.FromString(r.value)
        for r in records_of(out, layout)
        if r.topic == layout.audit()
    ]
    assert len(recs) == len(audits(out)) and verify(recs) == []
    # A same-rule hold that changes nothing is not recorded: far fewer records than ticks.
    assert len(recs) < 30


def test_bad_candidate_is_rolled_back() -> None:
    core = PolicyCore(window_ms=4000, step_ms=1000)
    out = core.on_command(start_cmd(), 100_000)
    out += drive(core, 100_000, 115_000, bad=True)
    tables = routing(out)
    assert tables[-1].plan.weight_of("v2") == 0.0 and tables[-1].plan.stable_version == "v1"
    assert core.rollouts.finished["r1"].phase is Phase.ROLLED_BACK
    assert any(a.decision.rule.startswith(("p99", "error", "latency")) for a in audits(out))


def test_restore_resumes_and_never_lowers_the_epoch() -> None:
    core = PolicyCore(window_ms=4000, step_ms=1000)
    out = core.on_command(start_cmd(), 100_000) + drive(core, 100_000, 106_000)
    last = [o for o in out if isinstance(o, RolloutPublication)][-1]
    assert last.state.phase is Phase.PROGRESSING
    pb = wire.rollout_state_to_pb(last.state, last.spec)
    table_epoch = routing(out)[-1].plan.epoch

    fresh = PolicyCore(window_ms=4000, step_ms=1000)
    state, spec = wire.rollout_state_from_pb(pb)
    fresh.restore([(state, spec)], {MODEL: table_epoch + 3}, {})
    assert fresh.rollouts[MODEL].state == last.state
    # A redelivered START of the same rollout is ignored.
    assert fresh.on_command(start_cmd(), 106_500) == []
    later = drive(fresh, 106_000, 140_000)
    epochs = [t.plan.epoch for t in routing(later)]
    assert epochs and min(epochs) > table_epoch + 3 and epochs == sorted(epochs)
    assert fresh.rollouts.finished["r1"].phase is Phase.PROMOTED


def test_manual_commands_and_rejections() -> None:
    core = PolicyCore(window_ms=4000, step_ms=1000)
    core.on_command(start_cmd(), 1_000)
    other = RolloutSpec(rollout_id="r2", model=MODEL, baseline="v1", candidate="v3")
    assert isinstance(core.on_command(start_cmd(other), 1_100)[0], CommandRejected)
    pause = Command(
        kind=CommandKind.MANUAL,
        model=MODEL,
        rollout_id="r1",
        manual=ManualCommand.PAUSE,
        command_id="c-p",
        note="by ops",
    )
    out = core.on_command(pause, 2_000)
    assert core.rollouts[MODEL].state.phase is Phase.PAUSED and not routing(out)
    assert isinstance(core.on_command(pause, 2_100)[0], CommandRejected)
    rollback = Command(
        kind=CommandKind.MANUAL,
        model=MODEL,
        rollout_id="r1",
        manual=ManualCommand.ROLLBACK,
        command_id="c-r",
    )
    out = core.on_command(rollback, 3_000)
    assert routing(out)[0].plan.weight_of("v2") == 0.0
    rec = audits(out)[0]
    assert rec.command_id == "c-r"
    assert isinstance(core.on_command(rollback, 3_100)[0], CommandRejected)


def test_command_from_pb() -> None:
    pb = rollout_pb2.RolloutCommand(
        command_id="c1",
        kind=rollout_pb2.COMMAND_START,
        model=MODEL,
        spec=rollout_spec_to_pb(SPEC),
    )
    cmd = command_from_pb(pb)
    assert isinstance(cmd, Command) and cmd.spec == SPEC
    broken = rollout_pb2.RolloutCommand(kind=rollout_pb2.COMMAND_START, model=MODEL)
    assert isinstance(command_from_pb(broken), CommandRejected)


def test_qos_steps_down_under_sustained_breach_and_back_up() -> None:
    policy = QosPolicy(
        model=MODEL,
        version="v1",
        slo_p99_ms=20.0,
        ladder=("fp32", "fp16", "int8"),
        sustain_s=2.0,
        min_dwell_s=3.0,
    )
    core = PolicyCore(window_ms=2000, step_ms=1000)
    core.restore([], {}, {VersionKey(MODEL, "v1"): ("fp32", 4)})
    core.on_command(Command(kind=CommandKind.SET_QOS_POLICY, model=MODEL, qos_policy=policy), 0)
    published: list[PrecisionPublication] = []
    variant = "fp32"
    for t in range(0, 40_000, 250):
        slow = t < 8_000  # p99 far above the SLO under load, then calm at a quarter of it
        core.on_telemetry(
            batch("v1", t, n=12 if slow else 3, ms=60.0 if slow else 3.0, variant=variant)
        )
        if t % 1000 == 0:
            for o in core.tick(t):
                if isinstance(o, PrecisionPublication):
                    published.append(o)
                    variant = o.decision.variant  # the worker switches
    variants = [p.decision.variant for p in published]
    assert variants[0] == "fp16" and variants[-1] == "fp32"  # one rung down first, back up last
    assert [p.epoch for p in published] == list(range(5, 5 + len(published)))
    layout = TopicLayout(prefix="p")
    rec = records_of(published[:1], layout)[0]
    cmd = control_pb2.PrecisionCommand.FromString(rec.value)
    assert rec.key == b"gpt/v1" and (cmd.variant, cmd.epoch) == ("fp16", 5)


def drive_promoted(core: PolicyCore, t0: int, t1: int, *, ms: float = 5.0) -> list[object]:
    """After a promotion: telemetry of the promoted version only, every 250 ms."""
    out: list[object] = []
    for t in range(t0, t1, 250):
        core.on_telemetry(batch("v2", t, ms=ms, errors=5 if ms > 5.0 else 0))
        if t % 1000 == 0:
            out.extend(core.tick(t))
    return out


def test_a_bake_survives_a_restore_and_a_regression_in_it_rolls_back() -> None:
    spec = replace(SPEC, bake_s=20.0)
    core = PolicyCore(window_ms=4000, step_ms=1000)
    out = core.on_command(start_cmd(spec), 100_000) + drive(core, 100_000, 110_000)
    assert core.rollouts[MODEL].state.phase is Phase.BAKING
    promoted = routing(out)[-1].plan
    assert promoted.stable_version == "v2" and promoted.weight_of("v2") == 100.0
    rules = [a.decision.rule for a in audits(out)]
    assert rules[rules.index("all_gates_passed", 1) :][-2:] == ["all_gates_passed", "baking"]

    # A restarted engine goes on from the published state: same reference, same end.
    last = [o for o in out if isinstance(o, RolloutPublication)][-1]
    assert last.state.phase is Phase.BAKING and last.state.bake_reference is not None
    state, restored_spec = wire.rollout_state_from_pb(wire.rollout_state_to_pb(last.state, spec))
    fresh = PolicyCore(window_ms=4000, step_ms=1000)
    fresh.restore([(state, restored_spec)], {MODEL: promoted.epoch}, {})
    assert fresh.rollouts[MODEL].state == core.rollouts[MODEL].state
    later = drive_promoted(fresh, 110_000, 118_000, ms=40.0)
    back = routing(later)
    assert [t.plan.stable_version for t in back] == ["v1"] and back[0].plan.weight_of("v2") == 0
    assert back[0].plan.epoch == promoted.epoch + 1
    ended = fresh.rollouts.finished["r1"]
    assert ended.phase is Phase.ROLLED_BACK and "during bake" in ended.last_reason


def test_a_clean_bake_ends_baked_without_a_new_table() -> None:
    spec = replace(SPEC, bake_s=10.0)
    core = PolicyCore(window_ms=4000, step_ms=1000)
    out = core.on_command(start_cmd(spec), 100_000) + drive(core, 100_000, 110_000)
    tables = len(routing(out))
    out += drive_promoted(core, 110_000, 130_000)
    assert len(routing(out)) == tables
    assert core.rollouts.finished["r1"].phase is Phase.PROMOTED
    assert [a.decision.rule for a in audits(out)][-1] == "baked"
    layout = TopicLayout(prefix="p")
    recs = [
        audit_pb2.AuditRecord.FromString(r.value)
        for r in records_of(out, layout)
        if r.topic == layout.audit()
    ]
    assert verify(recs) == []


def test_while_baking_the_promoted_version_is_under_its_own_qos_policy() -> None:
    spec = replace(SPEC, bake_s=60.0)
    core = PolicyCore(window_ms=4000, step_ms=1000)
    for version in ("v1", "v2"):
        policy = QosPolicy(model=MODEL, version=version, slo_p99_ms=20.0, ladder=("fp32", "fp16"))
        core.on_command(Command(kind=CommandKind.SET_QOS_POLICY, model=MODEL, qos_policy=policy), 0)
    out = core.on_command(start_cmd(spec), 100_000) + drive(core, 100_000, 110_000)
    assert core.rollouts[MODEL].state.phase is Phase.BAKING
    during = [o.decision.rule for o in out if isinstance(o, QosAudit) and o.rollout_id]
    assert "follow_baseline" in during or "like_for_like" in during, during
    later = drive_promoted(core, 110_000, 115_000)
    candidate = [
        o for o in later if isinstance(o, QosAudit) and o.policy and o.policy.version == "v2"
    ]
    rules = {o.decision.rule for o in candidate}
    assert rules and not rules & {"follow_baseline", "like_for_like"}, rules


def test_telemetry_that_arrives_late_is_judged_in_whole_steps() -> None:
    """Batches reach the engine 600 ms after they complete: each increment the sequential
    tests consume is a step whose telemetry has all arrived, not the newest step read
    while most of its batches are on their way (and never counted after)."""
    core = PolicyCore(window_ms=4000, step_ms=1000)
    core.restore([], {MODEL: 7}, {})
    held = replace(SPEC, steps=(Step(10.0, 10, 60.0), Step(100.0, 0, 0.0)))  # one long step
    sent = [(t + 600, t) for t in range(96_000, 110_000, 250)]  # (arrives, completed)
    for now in range(96_000, 110_000, 50):
        while sent and sent[0][0] <= now:
            _, completed = sent.pop(0)
            core.on_telemetry(batch("v1", completed), received_ms=now)
            core.on_telemetry(batch("v2", completed), received_ms=now)
        if now == 100_000:  # telemetry flows before the rollout starts, as in service
            core.on_command(start_cmd(held), now)
        if now % 1000 == 0:
            core.tick(now)
    active = core.rollouts.get(MODEL)
    assert active is not None
    errors = active.state.sequential.errors
    assert active.state.sequential.increments >= 5
    # Four batches of ten requests per step on each side, every step whole.
    assert errors.candidate_requests == errors.baseline_requests
    assert errors.candidate_requests == 40 * active.state.sequential.increments
