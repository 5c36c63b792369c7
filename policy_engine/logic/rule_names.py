"""Decision rule names of the load-aware and sequential gates, in one place.

The older rules (``p99_ratio``, ``error_rate``, ``no_data``, ...) live next to
the code that emits them (``gates``, ``rollout``); these are the rules added
for unresponsive and backlogged versions and the anytime-valid gates.
"""

from __future__ import annotations

__all__ = [
    "NEW_RULES",
    "RULE_BASELINE_UNRESPONSIVE",
    "RULE_CANDIDATE_BACKLOG",
    "RULE_CANDIDATE_UNRESPONSIVE",
    "RULE_ERROR_SEQUENTIAL",
    "RULE_LATENCY_SEQUENTIAL",
]

RULE_CANDIDATE_UNRESPONSIVE = "candidate_unresponsive"
"""The candidate gets traffic but answers nothing (no telemetry, or a lag that only grows)."""
RULE_BASELINE_UNRESPONSIVE = "baseline_unresponsive"
"""The baseline is in that state: nothing can be judged against it; hold, never promote."""
RULE_CANDIDATE_BACKLOG = "candidate_backlog"
"""The candidate queues while its service time is in line: capacity, not a regression."""
RULE_ERROR_SEQUENTIAL = "error_rate_sequential"
"""The anytime-valid error-rate test rejected "the candidate errs no more than allowed"."""
RULE_LATENCY_SEQUENTIAL = "service_time_sequential"
"""The anytime-valid test on the share of slow candidate requests rejected."""

NEW_RULES = frozenset(
    {
        RULE_CANDIDATE_UNRESPONSIVE,
        RULE_BASELINE_UNRESPONSIVE,
        RULE_CANDIDATE_BACKLOG,
        RULE_ERROR_SEQUENTIAL,
        RULE_LATENCY_SEQUENTIAL,
    }
)
