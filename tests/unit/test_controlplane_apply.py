"""The control plane's plan for an applied Rollout document: create, leave alone,
update what may change, refuse what may not (or a finished rollout's change)."""

from __future__ import annotations

from dataclasses import replace

from graylane.rollouts.spec import Step, StepPause, Strategy, WebhookTarget
from graylane.rollouts.vocabulary import Phase
from graylane.services.controlplane.logic.apply import ApplyAction, plan_apply
from tests.support.rollout_run import SPEC


def test_a_new_name_is_created() -> None:
    assert plan_apply(None, None, SPEC).action is ApplyAction.CREATE


def test_the_same_spec_is_unchanged_in_any_phase() -> None:
    for phase in Phase:
        applied = replace(SPEC, document_digest="sha256:abc", created_by="someone")
        assert plan_apply(SPEC, phase, applied).action is ApplyAction.UNCHANGED


def test_a_new_schedule_gates_and_webhooks_update_a_running_rollout() -> None:
    applied = replace(
        SPEC,
        steps=(Step(5.0, 10, 0.0, StepPause()), Step(100.0)),
        webhooks=(WebhookTarget("http://hooks.test/a"),),
        failures_to_rollback=3,
    )
    plan = plan_apply(SPEC, Phase.PROGRESSING, applied)
    assert plan.action is ApplyAction.UPDATE
    assert {c.field for c in plan.changes} == {"steps", "webhooks", "failures_to_rollback"}
    assert all(c.allowed for c in plan.changes)


def test_what_identifies_a_rollout_is_refused_with_the_reason() -> None:
    plan = plan_apply(SPEC, Phase.PROGRESSING, replace(SPEC, strategy=Strategy.AB_SPLIT))
    assert plan.action is ApplyAction.REFUSE
    assert "strategy canary -> ab_split" in plan.problem
    assert [c.allowed for c in plan.changes if c.field == "strategy"] == [False]


def test_a_finished_rollout_changes_no_more() -> None:
    applied = replace(SPEC, failures_to_rollback=5)
    plan = plan_apply(SPEC, Phase.PROMOTED, applied)
    assert plan.action is ApplyAction.REFUSE and "promoted" in plan.problem


def test_undo_to_a_revision_within_the_window() -> None:
    import pytest

    from graylane.services.controlplane.logic.rules import (
        FailedPrecondition,
        NotFound,
        revision_target,
    )

    window = [(3, "1.2.0"), (2, "1.1.0"), (1, "1.0.0")]
    assert revision_target("m", 1, window, None) == "1.0.0"
    assert revision_target("m", 2, window, None) == "1.1.0"
    with pytest.raises(FailedPrecondition, match="current stable"):
        revision_target("m", 3, window, None)
    with pytest.raises(NotFound, match="no stable revision 7 among its last 3"):
        revision_target("m", 7, window, None)
    with pytest.raises(FailedPrecondition, match="active rollout"):
        revision_target("m", 1, window, "ro-m-1")
