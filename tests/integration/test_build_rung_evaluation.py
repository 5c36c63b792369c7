"""The builder judges an engine-served version's rungs on real text: each llama.cpp rung
of SmolLM2 scored on the project's evaluation set, a rung that costs more than the spec
allows refused, the others' scores recorded in the registry."""

from __future__ import annotations

from pathlib import Path

import pytest

from graylane.artifacts.naming import Precision
from graylane.builder.build import run_build
from graylane.builder.spec import EngineSpec, load_spec
from graylane.builder.variants import VariantStatus
from graylane.registry.repository import open_registry
from tests.support.llamacpp import StartLlamaServer

SET = (
    Path(__file__).resolve().parents[2] / "graylane" / "evaluation" / "sets" / "smollm2-basic.jsonl"
)
SPEC = """
model: smollm2
version: 1.0.0
engine:
  backend: llamacpp
  version: "0.3.36"
  evaluation: {{set: {set}, max_drop: {max_drop}, limit: {limit}}}
  variants:
    - {{precision: q4_1, url: "{q4_1}"}}
    - {{precision: q4_0, url: "{q4_0}"}}
"""


@pytest.mark.slow
def test_each_rung_is_scored_and_one_that_costs_too_much_is_refused(
    smollm2_gguf: Path,
    smollm2_q4_0_gguf: Path,
    start_llama_server: StartLlamaServer,
    tmp_path: Path,
) -> None:
    upper = start_llama_server(smollm2_gguf, threads=1, slots=4)
    lower = start_llama_server(smollm2_q4_0_gguf, threads=1, slots=4)
    max_drop, limit = 0.05, 8
    path = tmp_path / "smollm2.yaml"
    path.write_text(
        SPEC.format(set=SET, max_drop=max_drop, limit=limit, q4_1=upper.url, q4_0=lower.url)
    )
    spec = load_spec(path)
    assert isinstance(spec, EngineSpec) and spec.engine.evaluation is not None
    registry = open_registry(f"sqlite:///{tmp_path / 'registry.db'}")
    try:
        report = run_build(spec, store=tmp_path / "store", registry=registry)
        stored = registry.rung_quality("smollm2", "1.0.0")
        artifacts = {a.precision for a in registry.list_artifacts("smollm2", "1.0.0")}
    finally:
        registry.engine.dispose()
    by_rung = {v.precision: v for v in report.variants}
    top = by_rung[Precision.Q4_1]
    assert top.status is VariantStatus.PRODUCED and top.quality is not None
    assert top.quality.quality_drop == 0.0 and top.quality.items == limit
    (note,) = [n for n in report.notes if n.startswith("evaluated on")]
    print(note)  # the figures
    low = by_rung[Precision.Q4_0]
    scored = note.split("q4_0 ")[1]
    low_score = float(scored.split(" ")[0])
    drop = top.quality.score - low_score
    assert f"cost {drop:+.3f}" in note
    if drop > max_drop:
        assert low.status is VariantStatus.FAILED and not report.ok
        assert low.reason is not None and f"quality drop {drop:.3f} > 0.05" in low.reason
        assert artifacts == {Precision.Q4_1} and set(stored) == {Precision.Q4_1}
    else:
        assert low.status is VariantStatus.PRODUCED and report.ok
        assert low.quality is not None and low.quality.quality_drop == pytest.approx(drop)
        assert set(stored) == {Precision.Q4_1, Precision.Q4_0}
    assert stored[Precision.Q4_1].score == pytest.approx(top.quality.score)
