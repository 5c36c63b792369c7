"""A ``Rollout`` document (YAML, ``apiVersion: graylane.io/v1``) to a spec and back.

``load_documents`` reads one or more documents (``---`` between them), checks each
against the JSON Schema that ships beside this module (``rollout.schema.json``), then
against the spec's own rules, and names the line of every problem
(:class:`ManifestInvalid`). ``render`` writes a live spec back in the same schema,
with a ``status`` block apply ignores; what it writes applies as it is.

The digest of a document is the sha256 of its canonical JSON (``apiVersion``,
``kind``, ``metadata.name``, ``spec``; keys sorted): comments, layout, labels and
``status`` do not change it. The audit records it with the start or the update.

Steps: a ``weight`` entry is a canary step; a ``pause`` entry makes the weight step
before it an approval step (see :class:`~graylane.rollouts.spec.StepPause`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from graylane.rollouts.errors import InvalidSpec
from graylane.rollouts.qos_policy import QosPolicy, UnmeasuredRung
from graylane.rollouts.spec import (
    DriftAction,
    GateMode,
    Gates,
    MetricComparison,
    MetricGate,
    RolloutSpec,
    Step,
    StepPause,
    Strategy,
    WebhookFormat,
    WebhookTarget,
)

__all__ = [
    "API_VERSION",
    "GATE_KEYS",
    "KIND",
    "SCHEMA_PATH",
    "ManifestInvalid",
    "ManifestProblem",
    "RolloutDocument",
    "digest_of",
    "load_documents",
    "parse_duration",
    "render",
]

API_VERSION = "graylane.io/v1"
KIND = "Rollout"
SCHEMA_PATH = Path(__file__).with_name("rollout.schema.json")

_STRATEGIES = {
    "canary": Strategy.CANARY,
    "shadow": Strategy.SHADOW_THEN_CANARY,
    "ab": Strategy.AB_SPLIT,
}
GATE_KEYS: dict[str, str] = {
    "maxP99Ratio": "max_p99_ratio",
    "maxErrorRateDelta": "max_error_rate_delta",
    "alpha": "alpha",
    "minOutputAgreement": "min_output_agreement",
    "p99FloorMs": "p99_floor_ms",
    "maxErrorRatio": "max_error_ratio",
    "errorBudget": "error_budget",
    "maxSlowRatio": "max_slow_ratio",
    "backlogQueueMs": "backlog_queue_ms",
    "tokenTimeTolerance": "token_time_tolerance",
    "maxLengthShift": "max_length_shift",
    "maxEosRateDelta": "max_eos_rate_delta",
    "maxSimilarityDrop": "max_similarity_drop",
}
_DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class ManifestProblem:
    """One thing wrong with a document, at ``line`` (1-based; 0 when unknown)."""

    source: str
    line: int
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line else self.source
        return f"{where}: {self.path or '(document)'}: {self.message}"


class ManifestInvalid(InvalidSpec):
    """A Rollout document breaks its schema or a rollout rule; every problem has its line."""

    def __init__(self, problems: Sequence[ManifestProblem]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


@dataclass(frozen=True)
class RolloutDocument:
    """One applied document: the rollout's name (its id), spec, QoS policy and digest."""

    name: str
    spec: RolloutSpec
    qos: QosPolicy | None
    digest: str
    source: str
    line: int


def parse_duration(value: float | int | str) -> float:
    """Seconds of ``30``, ``30s``, ``10m``, ``1h``, ``500ms``."""
    if isinstance(value, int | float):
        return float(value)
    match = _DURATION.match(value.strip())
    if match is None:
        raise ValueError(f"{value!r} is not a duration (30s, 10m, 1h, 500ms)")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def _duration_text(seconds: float) -> str:
    for unit, size in (("h", 3600.0), ("m", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


@cache
def _validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    return jsonschema.Draft202012Validator(schema)


def _line_of(node: yaml.Node | None, path: Sequence[str | int]) -> int:
    """The 1-based line of the value at ``path`` (or of the deepest node found on it)."""
    line = node.start_mark.line + 1 if node is not None else 0
    for key in path:
        if isinstance(node, yaml.MappingNode):
            found = next((v for k, v in node.value if getattr(k, "value", None) == key), None)
            if found is None:
                return line
            node = found
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int):
            if key >= len(node.value):
                return line
            node = node.value[key]
        else:
            return line
        line = node.start_mark.line + 1
    return line


def _dotted(path: Sequence[str | int]) -> str:
    out = ""
    for key in path:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out


def digest_of(document: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of what the document asks (not its status or labels)."""
    meta = document.get("metadata") or {}
    core = {
        "apiVersion": document.get("apiVersion"),
        "kind": document.get("kind"),
        "metadata": {"name": meta.get("name")},
        "spec": document.get("spec"),
    }
    canonical = json.dumps(core, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def load_documents(text: str, source: str = "<input>") -> list[RolloutDocument]:
    """Every Rollout document of ``text``; :class:`ManifestInvalid` lists all problems."""
    try:
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
        values = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 0
        raise ManifestInvalid([ManifestProblem(source, line, "", f"not YAML: {exc}")]) from None
    out: list[RolloutDocument] = []
    problems: list[ManifestProblem] = []
    for node, value in zip(nodes, values, strict=True):
        if value is None:
            continue  # an empty document between two ---
        found = [
            ManifestProblem(
                source,
                _line_of(node, list(e.absolute_path)),
                _dotted(list(e.absolute_path)),
                e.message,
            )
            for e in sorted(
                _validator().iter_errors(value), key=lambda e: list(map(str, e.absolute_path))
            )
        ]
        if found:
            problems += found
            continue
        try:
            out.append(_document(value, node, source))
        except ManifestInvalid as exc:
            problems += exc.problems
    if problems:
        raise ManifestInvalid(problems)
    return out


def _document(value: Mapping[str, Any], node: yaml.Node, source: str) -> RolloutDocument:
    name = str(value["metadata"]["name"])
    body: Mapping[str, Any] = value["spec"]
    digest = digest_of(value)

    def problem(path: Sequence[str | int], message: str) -> ManifestInvalid:
        return ManifestInvalid(
            [ManifestProblem(source, _line_of(node, path), _dotted(path), message)]
        )

    steps: list[Step] = []
    for i, entry in enumerate(body.get("steps") or ()):
        if "pause" in entry:
            if not steps:
                raise problem(["spec", "steps", i], "a pause must follow a weight step")
            if steps[-1].pause is not None:
                raise problem(["spec", "steps", i], "two pauses after one weight step")
            wait = entry["pause"].get("duration")
            seconds = parse_duration(wait) if wait is not None else None
            if seconds is not None and seconds <= 0:
                raise problem(["spec", "steps", i, "pause", "duration"], "must be positive")
            steps[-1] = replace(steps[-1], pause=StepPause(seconds))
            continue
        default = Step(float(entry["weight"]))
        steps.append(
            Step(
                float(entry["weight"]),
                int(entry.get("samples", default.min_samples)),
                parse_duration(entry.get("dwell", default.min_dwell_s)),
            )
        )
    if steps and steps[-1].pause is not None and steps[-1].weight_percent >= 100.0:
        raise problem(["spec", "steps"], "a pause after the 100% step has nothing to approve")
    gates_in: Mapping[str, Any] = body.get("gates") or {}
    gate_args: dict[str, Any] = {
        field: float(gates_in[key]) for key, field in GATE_KEYS.items() if key in gates_in
    }
    if "mode" in gates_in:
        gate_args["mode"] = GateMode(gates_in["mode"])
    if "lengthDrift" in gates_in:
        gate_args["length_drift"] = DriftAction(gates_in["lengthDrift"])
    if "unresponsive" in gates_in:
        gate_args["unresponsive_s"] = parse_duration(gates_in["unresponsive"])
    if "metrics" in gates_in:
        gate_args["metrics"] = tuple(
            MetricGate(
                name=m["name"],
                query=m["query"],
                comparison=MetricComparison(m["condition"]),
                threshold=float(m["threshold"]),
                pause_after_inconclusive_s=parse_duration(m.get("pauseAfterInconclusive", 0)),
            )
            for m in gates_in["metrics"]
        )
    base = RolloutSpec(rollout_id="-", model="-", baseline="-a", candidate="-b")
    shadow = body.get("shadow") or {}
    ab = body.get("ab") or {}
    hooks = ((body.get("notifications") or {}).get("webhooks")) or ()
    try:
        spec = RolloutSpec(
            rollout_id=name,
            model=body["model"],
            baseline=body["baseline"],
            candidate=body["candidate"],
            strategy=_STRATEGIES[body.get("strategy", "canary")],
            steps=tuple(steps) if steps else base.steps,
            gates=Gates(**gate_args),
            failures_to_rollback=int(gates_in.get("failuresToRollback", base.failures_to_rollback)),
            shadow_share=float(shadow.get("share", base.shadow_share)),
            shadow_duration_s=parse_duration(shadow.get("duration", base.shadow_duration_s)),
            ab_weight_percent=float(ab.get("weight", base.ab_weight_percent)),
            ab_duration_s=parse_duration(ab.get("duration", base.ab_duration_s)),
            bake_s=parse_duration(body.get("bake", base.bake_s)),
            document_digest=digest,
            webhooks=tuple(
                WebhookTarget(
                    url=h["url"],
                    format=WebhookFormat(h.get("format", "cloudevents")),
                    secret_file=h.get("secretFile", ""),
                )
                for h in hooks
            ),
        )
    except InvalidSpec as exc:
        raise problem(["spec"], str(exc).removeprefix(f"rollout {name!r}: ")) from None
    qos = None
    if "qos" in body:
        q = body["qos"]
        try:
            qos = QosPolicy(
                model=spec.model,
                version=q.get("version", spec.candidate),
                slo_p99_ms=float(q.get("sloP99Ms", 0.0)),
                slo_ttft_p99_ms=float(q.get("sloTtftP99Ms", 0.0)),
                slo_tpot_p99_ms=float(q.get("sloTpotP99Ms", 0.0)),
                ladder=tuple(q["ladder"]),
                quality_floor=q.get("qualityFloor", ""),
                enabled=bool(q.get("enabled", True)),
                max_quality_drop=float(q["maxQualityDrop"]) if "maxQualityDrop" in q else None,
                unmeasured_rung=UnmeasuredRung(q.get("unmeasuredRung", "allowed")),
            )
        except (InvalidSpec, ValueError) as exc:
            raise problem(["spec", "qos"], str(exc)) from None
    return RolloutDocument(
        name=name, spec=spec, qos=qos, digest=digest, source=source, line=node.start_mark.line + 1
    )


def _spec_body(spec: RolloutSpec, qos: QosPolicy | None) -> dict[str, Any]:
    strategy = next(k for k, v in _STRATEGIES.items() if v is spec.strategy)
    steps: list[dict[str, Any]] = []
    for s in spec.steps:
        steps.append(
            {
                "weight": s.weight_percent,
                "samples": s.min_samples,
                "dwell": _duration_text(s.min_dwell_s),
            }
        )
        if s.pause is not None:
            wait = s.pause.duration_s
            steps.append({"pause": {"duration": _duration_text(wait)} if wait else {}})
    g = spec.gates
    gates: dict[str, Any] = {"mode": g.mode.value, "failuresToRollback": spec.failures_to_rollback}
    gates |= {key: getattr(g, field) for key, field in GATE_KEYS.items()}
    gates["unresponsive"] = _duration_text(g.unresponsive_s)
    gates["lengthDrift"] = g.length_drift.value
    if g.metrics:
        gates["metrics"] = [
            {
                "name": m.name,
                "query": m.query,
                "condition": m.comparison.value,
                "threshold": m.threshold,
                "pauseAfterInconclusive": _duration_text(m.pause_after_inconclusive_s),
            }
            for m in g.metrics
        ]
    body: dict[str, Any] = {
        "model": spec.model,
        "baseline": spec.baseline,
        "candidate": spec.candidate,
        "strategy": strategy,
    }
    if spec.strategy is Strategy.SHADOW_THEN_CANARY:
        body["shadow"] = {
            "share": spec.shadow_share,
            "duration": _duration_text(spec.shadow_duration_s),
        }
    if spec.strategy is Strategy.AB_SPLIT:
        body["ab"] = {
            "weight": spec.ab_weight_percent,
            "duration": _duration_text(spec.ab_duration_s),
        }
    if spec.bake_s:
        body["bake"] = _duration_text(spec.bake_s)
    body["steps"] = steps
    body["gates"] = gates
    if qos is not None:
        body["qos"] = {
            "version": qos.version,
            "sloP99Ms": qos.slo_p99_ms,
            "sloTtftP99Ms": qos.slo_ttft_p99_ms,
            "sloTpotP99Ms": qos.slo_tpot_p99_ms,
            "ladder": list(qos.ladder),
            "qualityFloor": qos.quality_floor,
            "enabled": qos.enabled,
        }
        if qos.max_quality_drop is not None:
            body["qos"]["maxQualityDrop"] = qos.max_quality_drop
            body["qos"]["unmeasuredRung"] = qos.unmeasured_rung.value
    if spec.webhooks:
        body["notifications"] = {
            "webhooks": [
                {"url": w.url, "format": w.format.value}
                | ({"secretFile": w.secret_file} if w.secret_file else {})
                for w in spec.webhooks
            ]
        }
    return body


def render(
    spec: RolloutSpec, *, qos: QosPolicy | None = None, status: Mapping[str, Any] | None = None
) -> str:
    """The spec as a Rollout document (YAML); ``status`` (phase, step, ...) goes after it."""
    document: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": spec.rollout_id},
        "spec": _spec_body(spec, qos),
    }
    if status:
        document["status"] = dict(status)
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=False)
