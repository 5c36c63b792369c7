"""Errors of the policy decision logic, grouped by kind of failure."""

from __future__ import annotations

from graylane.errors import ErrorCode, GraylaneError

__all__ = [
    "InputMismatch",
    "InvalidPolicy",
    "InvalidSpec",
    "InvalidTransition",
    "PolicyError",
    "RolloutFinished",
]


class PolicyError(GraylaneError):
    """Base of every error raised by the policy decision logic."""

    code = ErrorCode.BAD_REQUEST
    retriable = False


class InvalidSpec(PolicyError, ValueError):
    """A rollout spec breaks a rule (steps, gates, shares, durations)."""


class InvalidPolicy(PolicyError, ValueError):
    """A QoS policy breaks a rule (ladder, floor, thresholds)."""


class InvalidTransition(PolicyError):
    """The rollout cannot go from its phase to the requested one."""


class RolloutFinished(InvalidTransition):
    """The rollout is in a terminal phase and accepts no input."""


class InputMismatch(PolicyError, ValueError):
    """Stats handed to a controller are not of its model / versions, or not one window."""
