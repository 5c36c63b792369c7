"""``graylane eval`` against real engines: the rungs of SmolLM2 on llama.cpp scored on the
project's evaluation set, and a version asked over Kafka (its version topic)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graylane.app.cli.main import main
from graylane.client import GraylaneClient
from graylane.evaluation.runner import VersionTarget, answer_all, score_all
from graylane.evaluation.sets import load_set
from graylane.kafka.seam import KafkaFactory
from tests.support.llamacpp import StartLlamaServer
from tests.support.stack import running_stack

pytestmark = [pytest.mark.kafka]

SET = (
    Path(__file__).resolve().parents[2] / "graylane" / "evaluation" / "sets" / "smollm2-basic.jsonl"
)


def test_eval_scores_each_rung_and_compares_them_on_the_same_items(
    smollm2_gguf: Path,
    smollm2_q2k_gguf: Path,
    start_llama_server: StartLlamaServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    upper = start_llama_server(smollm2_gguf, threads=1, slots=4)
    lower = start_llama_server(smollm2_q2k_gguf, threads=1, slots=4)
    plot = tmp_path / "eval.png"
    code = main(
        [
            "eval",
            str(SET),
            "--endpoint",
            f"q4_1={upper.url}",
            "--endpoint",
            f"q2_k={lower.url}",
            "--limit",
            "24",
            "--plot",
            str(plot),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    line = json.loads(out.strip().splitlines()[-1])
    assert line["items"] == 24 and line["set_sha256"] == load_set(SET).digest
    for name in ("q4_1", "q2_k"):
        target = line["targets"][name]
        assert 0.0 <= target["ci"][0] <= target["score"] <= target["ci"][1] <= 1.0
        assert target["errors"] == 0
    versus = line["against_first"]["q2_k"]
    assert 0.0 < versus["p_value"] <= 1.0
    assert versus["ci"][0] <= versus["difference"] <= versus["ci"][1]
    assert "scores (mean item score" in out and "24/24 answered" in out
    assert plot.stat().st_size > 0


async def test_a_version_is_asked_over_its_version_topic(
    factory: KafkaFactory, smollm2_q4_0_gguf: Path, start_llama_server: StartLlamaServer
) -> None:
    server = start_llama_server(smollm2_q4_0_gguf, threads=1, slots=4)
    items = load_set(SET).items[:6]
    async with (
        running_stack(
            factory,
            model="smollm2",
            versions={},
            stable="1.0.0",
            endpoints={"1.0.0": [server.endpoint("q4_0")]},
        ),
        GraylaneClient(factory, client_id="eval-test") as client,
    ):
        answers = await answer_all(VersionTarget(client, "smollm2", "1.0.0"), items)
    scores = await score_all(answers, None)
    assert [a.item.id for a in answers] == [i.id for i in items]
    assert all(a.text for a in answers), [a.error for a in answers]
    assert not any(s.error for s in scores)
    assert sum(s.passed for s in scores) >= 3  # capitals: a trained model knows most
