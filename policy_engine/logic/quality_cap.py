"""The quality cap of a QoS ladder (pure): which rungs a step down may land on.

Each rung of a version may have a measured quality cost (``graylane eval --record``:
the reference rung's evaluation score minus the rung's, on the same items; the
policy's :attr:`~graylane.rollouts.qos_policy.QosPolicy.rung_quality_drop`). A policy
with ``max_quality_drop`` refuses every rung that costs more; a rung with no
measurement is allowed (and shown as unmeasured) unless the policy says
``unmeasured_rung: refused``. The top rung is always allowed: it is where QoS starts.

QoS moves one rung at a time, so the first refused rung down the ladder is a floor:
:func:`capped_floor` is the lowest rung QoS may run, the policy's ``quality_floor`` or
the rung above the first refused one, whichever is higher. A cheaper rung further
down that happens to measure better is not reached by skipping (the ladder's order is
the operator's), and a breach held at that floor is what the replica controller
answers with more replicas, as at the quality floor.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from graylane.rollouts.qos_policy import QosPolicy, UnmeasuredRung

__all__ = [
    "CappedFloor",
    "RungAdmission",
    "RungQualityVerdict",
    "capped_floor",
    "ladder_verdicts",
    "quality_drop",
    "rung_verdict",
]


def quality_drop(reference_score: float, score: float) -> float:
    """A rung's quality cost: the reference rung's score minus its own (positive: worse)."""
    return reference_score - score


class RungAdmission(Enum):
    """Whether a step down may land on a rung, and why."""

    WITHIN_CAP = "within_cap"
    """Measured, and its drop is at most the cap (or there is no cap)."""
    UNMEASURED = "unmeasured"
    """No measurement; allowed (the policy's default)."""
    OVER_CAP = "over_cap"
    """Measured, and its drop exceeds the cap: refused."""
    UNMEASURED_REFUSED = "unmeasured_refused"
    """No measurement, and the policy refuses unmeasured rungs under its cap."""

    @property
    def allowed(self) -> bool:
        return self in (RungAdmission.WITHIN_CAP, RungAdmission.UNMEASURED)


@dataclass(frozen=True)
class RungQualityVerdict:
    variant: str
    drop: float | None
    """Measured quality drop (None: unmeasured)."""
    cap: float | None
    """The policy's ``max_quality_drop`` (None: no cap)."""
    admission: RungAdmission

    @property
    def allowed(self) -> bool:
        return self.admission.allowed

    def describe(self) -> str:
        """``q4_0 costs 0.144 > cap 0.050``, ``q2_k unmeasured (refused under cap 0.050)``."""
        cap = f"cap {self.cap:.3f}" if self.cap is not None else "no cap"
        if self.drop is None:
            verdict = "refused" if not self.allowed else "allowed"
            return f"{self.variant} unmeasured ({verdict} under {cap})"
        sign = ">" if self.admission is RungAdmission.OVER_CAP else "<="
        if self.cap is None:
            return f"{self.variant} costs {self.drop:.3f} ({cap})"
        return f"{self.variant} costs {self.drop:.3f} {sign} {cap}"


def rung_verdict(policy: QosPolicy, variant: str) -> RungQualityVerdict:
    """Whether QoS may step onto ``variant`` under the policy's quality cap."""
    drop = policy.quality_drop_of(variant)
    cap = policy.max_quality_drop
    top = bool(policy.ladder) and policy.ladder[0] == variant
    if drop is None:
        refused = cap is not None and not top and policy.unmeasured_rung is UnmeasuredRung.REFUSED
        admission = RungAdmission.UNMEASURED_REFUSED if refused else RungAdmission.UNMEASURED
    elif cap is not None and drop > cap and not top:
        admission = RungAdmission.OVER_CAP
    else:
        admission = RungAdmission.WITHIN_CAP
    return RungQualityVerdict(variant=variant, drop=drop, cap=cap, admission=admission)


def ladder_verdicts(policy: QosPolicy) -> tuple[RungQualityVerdict, ...]:
    """The verdict of every rung, in ladder order."""
    return tuple(rung_verdict(policy, variant) for variant in policy.ladder)


@dataclass(frozen=True)
class CappedFloor:
    index: int
    """The lowest ladder index QoS may run."""
    refused: RungQualityVerdict | None
    """The rung whose refusal set the floor (None: the policy's ``quality_floor`` did)."""

    @property
    def by_cap(self) -> bool:
        return self.refused is not None


def capped_floor(policy: QosPolicy) -> CappedFloor:
    """The policy's quality floor, raised to above the first rung the cap refuses."""
    floor = policy.floor_index
    for index, variant in enumerate(policy.ladder[: floor + 1]):
        verdict = rung_verdict(policy, variant)
        if not verdict.allowed:
            return CappedFloor(index=index - 1, refused=verdict)
    return CappedFloor(index=floor, refused=None)
