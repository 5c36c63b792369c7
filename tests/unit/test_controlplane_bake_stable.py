"""The registry's stable version through a bake: stable at the promotion that starts the
bake, kept when the bake ends, given back to the baseline when it is rolled back."""

from __future__ import annotations

from pathlib import Path

from graylane.registry.repository import open_registry
from graylane.rollouts.pb import rollout_spec_to_pb
from graylane.rollouts.spec import RolloutSpec
from graylane.services.controlplane.audit_sink import RolloutHub
from graylane.services.controlplane.auth import ApiRole, Principal, TokenTable
from graylane.services.controlplane.servicers import ControlPlane
from graylane.services.controlplane.state import open_store
from graylane.v1 import rollout_pb2

MODEL, BASE, CANDIDATE = "m", "1.0.0", "1.1.0"
SPEC = RolloutSpec(
    rollout_id="ro-m-1", model=MODEL, baseline=BASE, candidate=CANDIDATE, bake_s=60.0
)


class NoBus:
    async def publish(self, command: rollout_pb2.RolloutCommand) -> None:
        raise AssertionError("nothing is published here")


def _plane(tmp_path: Path) -> ControlPlane:
    url = f"sqlite:///{tmp_path / 'cp.db'}"
    registry = open_registry(url)
    registry.register_model(MODEL, "baked")
    for version in (BASE, CANDIDATE):
        registry.register_version(MODEL, version, "a" * 64)
    registry.set_stable(MODEL, BASE)
    plane = ControlPlane(
        registry=registry,
        store=open_store(url),
        bus=NoBus(),
        hub=RolloutHub(),
        tokens=TokenTable({"t": Principal("ops", ApiRole.OPERATOR)}),
    )
    plane.store.on_promoted(plane.record_promotion)
    plane.store.on_rolled_back(plane.record_rollback)
    return plane


def _state(phase: rollout_pb2.RolloutPhase, at: int) -> rollout_pb2.RolloutState:
    return rollout_pb2.RolloutState(
        rollout_id=SPEC.rollout_id,
        model=MODEL,
        phase=phase,
        updated_at_unix_ms=at,
        spec=rollout_spec_to_pb(SPEC),
    )


def _stable(plane: ControlPlane) -> str:
    info = plane.registry.get_stable(MODEL)
    return str(info.version) if info is not None else ""


def _revisions(plane: ControlPlane) -> list[str]:
    return [str(r.version) for r in plane.registry.stable_revisions(MODEL)]


def test_a_rollback_during_bake_gives_the_stable_version_back(tmp_path: Path) -> None:
    plane = _plane(tmp_path)
    plane.store.apply_state(_state(rollout_pb2.PROGRESSING, 1))
    assert _stable(plane) == BASE
    plane.store.apply_state(_state(rollout_pb2.BAKING, 2))
    assert _stable(plane) == CANDIDATE
    plane.store.apply_state(_state(rollout_pb2.ROLLED_BACK, 3))
    assert _stable(plane) == BASE
    assert _revisions(plane) == [BASE, CANDIDATE, BASE]


def test_a_clean_bake_keeps_the_promotion_once(tmp_path: Path) -> None:
    plane = _plane(tmp_path)
    plane.store.apply_state(_state(rollout_pb2.PROGRESSING, 1))
    plane.store.apply_state(_state(rollout_pb2.BAKING, 2))
    plane.store.apply_state(_state(rollout_pb2.PROMOTED, 3))
    assert _stable(plane) == CANDIDATE
    assert _revisions(plane) == [CANDIDATE, BASE]  # one revision for the promotion


def test_a_rollback_before_the_promotion_leaves_the_registry_alone(tmp_path: Path) -> None:
    plane = _plane(tmp_path)
    plane.store.apply_state(_state(rollout_pb2.PROGRESSING, 1))
    plane.store.apply_state(_state(rollout_pb2.ROLLED_BACK, 2))
    assert _stable(plane) == BASE and _revisions(plane) == [BASE]


def test_a_later_state_with_a_lower_epoch_is_passed_over(tmp_path: Path) -> None:
    """A sharded engine's zombie writes later states below its successor's epoch: the
    control plane keeps the successor's rollback, not the zombie's progress."""
    plane = _plane(tmp_path)
    successor = _state(rollout_pb2.ROLLED_BACK, 2_000)
    successor.epoch = (3 << 32) + 1
    zombie = _state(rollout_pb2.PROGRESSING, 3_000)
    zombie.epoch = (1 << 32) + 7
    first = _state(rollout_pb2.PROGRESSING, 1_000)
    first.epoch = (1 << 32) + 6
    assert plane.store.apply_state(first)
    assert plane.store.apply_state(successor)
    assert not plane.store.apply_state(zombie)
    (stored,) = plane.store.list_rollouts(MODEL, active_only=False, limit=5)
    assert stored.state.phase == rollout_pb2.ROLLED_BACK
    assert stored.state.epoch == successor.epoch
    later = _state(rollout_pb2.ROLLED_BACK, 4_000)
    later.epoch = successor.epoch
    later.last_reason = "same epoch, later: taken"
    assert plane.store.apply_state(later)
