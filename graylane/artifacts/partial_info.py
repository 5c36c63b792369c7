"""The manifest's ``partial_quantization`` section to and from JSON-ready dicts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graylane.artifacts.build_info import GroupSensitivity, PartialQuantization

__all__ = ["partial_from_dict", "partial_to_dict"]


def _opt(raw: Any) -> float | None:
    return None if raw is None else float(raw)


def partial_to_dict(p: PartialQuantization | None) -> dict[str, Any] | None:
    if p is None:
        return None
    return {
        "full_failures": list(p.full_failures),
        "full_top1_agreement": p.full_top1_agreement,
        "quantizable_nodes": p.quantizable_nodes,
        "node_budget": p.node_budget,
        "kept_float": list(p.kept_float),
        "passed": p.passed,
        "trials": p.trials,
        "sensitivity": [
            {
                "group": s.group,
                "nodes": list(s.nodes),
                "top1_agreement": s.top1_agreement,
                "cosine": s.cosine,
            }
            for s in p.sensitivity
        ],
        "fp32_ms": p.fp32_ms,
        "variant_ms": p.variant_ms,
        "full_ms": p.full_ms,
        "speedup_vs_fp32": p.speedup_vs_fp32,
    }


def partial_from_dict(raw: Mapping[str, Any] | None) -> PartialQuantization | None:
    if raw is None:
        return None
    return PartialQuantization(
        full_failures=tuple(str(f) for f in raw["full_failures"]),
        full_top1_agreement=_opt(raw.get("full_top1_agreement")),
        quantizable_nodes=int(raw["quantizable_nodes"]),
        node_budget=int(raw["node_budget"]),
        kept_float=tuple(str(n) for n in raw["kept_float"]),
        passed=bool(raw["passed"]),
        trials=int(raw["trials"]),
        sensitivity=tuple(
            GroupSensitivity(
                group=str(s["group"]),
                nodes=tuple(str(n) for n in s["nodes"]),
                top1_agreement=float(s["top1_agreement"]),
                cosine=float(s["cosine"]),
            )
            for s in raw.get("sensitivity", ())
        ),
        fp32_ms=_opt(raw.get("fp32_ms")),
        variant_ms=_opt(raw.get("variant_ms")),
        full_ms=_opt(raw.get("full_ms")),
    )
