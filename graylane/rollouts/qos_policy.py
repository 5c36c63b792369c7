"""A QoS policy: SLO and precision ladder of one model version (validated on construction).

``rung_capacity_rps`` carries the measured capacity of one worker per variant
(``graylane calibrate``): stepping up to a rung whose capacity is known needs
the offered load below ``up_capacity_fraction`` of it, whatever the p99 of
the cheaper rung says (its p99 at normal load may never fall under the
latency threshold). ``max_shed_fraction``: shedding more than that share of
requests is a breach (admission control keeps the p99 of admitted requests
low, so latency alone would never step down).

**Generative models** state their SLO as a p99 of time to first token
(``slo_ttft_p99_ms``) and/or of time per output token (``slo_tpot_p99_ms``);
``slo_p99_ms`` (whole-request latency, mostly the output length for a
generation) may then be 0: not judged. The same margins apply to each
objective. Their load signals are the decode loop's waiting sequences and
KV-cache occupancy, per worker: ``max_waiting_sequences`` (0 = derived from the
rung's measured capacity and the TTFT objective: the queue one worker drains
within it; without either, :data:`INFERENCE_EXTENSION_QUEUE_DEPTH`) and
``max_kv_cache_occupancy`` (0 = :data:`INFERENCE_EXTENSION_KV_CACHE_OCCUPANCY`).
Decisions report both against the Gateway API Inference Extension's defaults.

**Quality cap**: ``rung_quality_drop`` carries the measured quality cost of each rung
(the reference rung's evaluation score minus the rung's, ``graylane eval --record``;
the control plane fills it from the registry). With ``max_quality_drop`` set, QoS
never steps onto a rung that costs more: the first such rung down the ladder acts as
a floor (the rung above it is the lowest QoS goes). A rung with no measurement is
allowed (shown as unmeasured) unless ``unmeasured_rung`` is
:attr:`UnmeasuredRung.REFUSED`. The top rung is always allowed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from graylane.rollouts.errors import InvalidPolicy

__all__ = [
    "INFERENCE_EXTENSION_KV_CACHE_OCCUPANCY",
    "INFERENCE_EXTENSION_QUEUE_DEPTH",
    "QosPolicy",
    "UnmeasuredRung",
]

INFERENCE_EXTENSION_QUEUE_DEPTH = 5
"""The Gateway API Inference Extension's default queue-depth threshold (waiting
requests per model server) above which it sends new requests elsewhere."""
INFERENCE_EXTENSION_KV_CACHE_OCCUPANCY = 0.8
"""The Gateway API Inference Extension's default KV-cache utilisation threshold."""


class UnmeasuredRung(Enum):
    """Under a quality cap, whether a rung with no measured quality may be stepped onto."""

    ALLOWED = "allowed"
    REFUSED = "refused"


@dataclass(frozen=True, kw_only=True)
class QosPolicy:
    model: str
    version: str
    slo_p99_ms: float
    ladder: tuple[str, ...]
    quality_floor: str = ""
    step_down_margin: float = 0.2
    step_up_ratio: float = 0.6
    max_queue_wait_ms: float = 0.0
    sustain_s: float = 5.0
    min_dwell_s: float = 30.0
    enabled: bool = True
    up_load_fraction: float = 0.8
    ceiling_ttl_s: float = 600.0
    rung_capacity_rps: tuple[tuple[str, float], ...] = ()
    """(variant, requests/s of one worker) as calibrated; sorted by variant."""
    up_capacity_fraction: float = 0.7
    max_shed_fraction: float = 0.02
    slo_ttft_p99_ms: float = 0.0
    """Generative: p99 time to first token objective (0 = not stated)."""
    slo_tpot_p99_ms: float = 0.0
    """Generative: p99 time per output token objective (0 = not stated)."""
    max_waiting_sequences: float = 0.0
    """Generative: waiting sequences per worker that breach (0 = derived, see above)."""
    max_kv_cache_occupancy: float = 0.0
    """Generative: KV-cache occupancy (0..1) that breaches (0 = the Inference Extension's 0.8)."""
    max_quality_drop: float | None = None
    """The most measured quality drop a rung may have to be stepped onto (None: no cap)."""
    rung_quality_drop: tuple[tuple[str, float], ...] = ()
    """(variant, reference score - its score) as measured; sorted by variant."""
    unmeasured_rung: UnmeasuredRung = UnmeasuredRung.ALLOWED
    """Under a cap, whether a rung with no measurement may be stepped onto."""

    def __post_init__(self) -> None:
        problems: list[str] = []
        if not self.ladder:
            problems.append("the ladder is empty")
        if len(set(self.ladder)) != len(self.ladder):
            problems.append(f"the ladder {self.ladder} repeats a variant")
        if self.quality_floor and self.quality_floor not in self.ladder:
            problems.append(f"quality floor {self.quality_floor!r} is not on the ladder")
        checks = (
            ("slo_p99_ms", self.slo_p99_ms > 0.0 or (self.generative and self.slo_p99_ms == 0)),
            ("slo_ttft_p99_ms", self.slo_ttft_p99_ms >= 0.0),
            ("slo_tpot_p99_ms", self.slo_tpot_p99_ms >= 0.0),
            ("max_waiting_sequences", self.max_waiting_sequences >= 0.0),
            ("max_kv_cache_occupancy", 0.0 <= self.max_kv_cache_occupancy <= 1.0),
            ("step_down_margin", self.step_down_margin >= 0.0),
            ("step_up_ratio", 0.0 < self.step_up_ratio < 1.0 + self.step_down_margin),
            ("max_queue_wait_ms", self.max_queue_wait_ms >= 0.0),
            ("sustain_s", self.sustain_s >= 0.0),
            ("min_dwell_s", self.min_dwell_s >= 0.0),
            ("up_load_fraction", 0.0 < self.up_load_fraction <= 1.0),
            ("ceiling_ttl_s", self.ceiling_ttl_s >= 0.0),
            ("up_capacity_fraction", 0.0 < self.up_capacity_fraction <= 1.0),
            ("max_shed_fraction", 0.0 <= self.max_shed_fraction <= 1.0),
        )
        for name, ok in checks:
            value = getattr(self, name)
            if not (math.isfinite(value) and ok):
                problems.append(f"{name} {value} is out of range")
        names = [name for name, _ in self.rung_capacity_rps]
        if len(set(names)) != len(names):
            problems.append(f"rung capacities {names} repeat a variant")
        for name, rps in self.rung_capacity_rps:
            if name not in self.ladder:
                problems.append(f"capacity of {name!r}, which is not on the ladder")
            if not (math.isfinite(rps) and rps > 0.0):
                problems.append(f"capacity of {name!r} {rps} is out of range")
        if self.max_quality_drop is not None and not (
            math.isfinite(self.max_quality_drop) and 0.0 <= self.max_quality_drop <= 1.0
        ):
            problems.append(f"max_quality_drop {self.max_quality_drop} is out of range")
        drops = [name for name, _ in self.rung_quality_drop]
        if len(set(drops)) != len(drops):
            problems.append(f"rung quality drops {drops} repeat a variant")
        for name, drop in self.rung_quality_drop:
            if name not in self.ladder:
                problems.append(f"quality drop of {name!r}, which is not on the ladder")
            if not (math.isfinite(drop) and -1.0 <= drop <= 1.0):
                problems.append(f"quality drop of {name!r} {drop} is out of range")
        if problems:
            raise InvalidPolicy(
                f"QoS policy of {self.model}/{self.version}: " + "; ".join(problems)
            )

    @property
    def generative(self) -> bool:
        """The SLO is stated on TTFT and/or TPOT (a generative model's)."""
        return self.slo_ttft_p99_ms > 0.0 or self.slo_tpot_p99_ms > 0.0

    @property
    def objectives(self) -> str:
        """The SLO in words: ``p99 250 ms``, ``TTFT p99 500 ms, TPOT p99 50 ms``."""
        parts = [
            f"{name} {ms:g} ms"
            for name, ms in (
                ("p99", self.slo_p99_ms),
                ("TTFT p99", self.slo_ttft_p99_ms),
                ("TPOT p99", self.slo_tpot_p99_ms),
            )
            if ms > 0.0
        ]
        return ", ".join(parts)

    @property
    def kv_cache_limit(self) -> float:
        """KV-cache occupancy that breaches."""
        return self.max_kv_cache_occupancy or INFERENCE_EXTENSION_KV_CACHE_OCCUPANCY

    @property
    def down_threshold_ms(self) -> float:
        return self.slo_p99_ms * (1.0 + self.step_down_margin)

    @property
    def up_threshold_ms(self) -> float:
        return self.slo_p99_ms * self.step_up_ratio

    @property
    def floor_index(self) -> int:
        return self.ladder.index(self.quality_floor) if self.quality_floor else len(self.ladder) - 1

    def capacity_of(self, variant: str) -> float | None:
        """Calibrated requests/s of one worker running ``variant``; None when unknown."""
        return next((rps for name, rps in self.rung_capacity_rps if name == variant), None)

    def quality_drop_of(self, variant: str) -> float | None:
        """Measured quality drop of ``variant`` (reference score - its score); None: unmeasured."""
        return next((d for name, d in self.rung_quality_drop if name == variant), None)
