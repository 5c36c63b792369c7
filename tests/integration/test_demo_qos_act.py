"""The demo's QoS act on the real broker: SmolLM2 built by the builder from its GGUF into
ONNX (fp32 and int8-weight-only), served by a native worker from the registry; under a
spike derived from the capacity measured here the policy engine steps it down a rung and,
once the spike is over, back up. Judged from what the system records (the audit's
precision changes, the precision topic, the results' variants) and from the answers'
text, the engine's own."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from graylane import serde
from graylane.app.cli.demo import start_service, stop_services
from graylane.app.demo.build_versions import build_smollm2_onnx
from graylane.app.demo.qos_act import (
    LADDER,
    QOS_MODEL,
    QOS_VERSION,
    chat_template_of,
    run_qos_act,
)
from graylane.kafka.admin import ensure_topics
from graylane.kafka.reading import read_to_end
from graylane.kafka.seam import KafkaFactory
from graylane.policy_engine.service import PolicyConfig, prepare_topics
from graylane.settings import Settings
from graylane.v1 import control_pb2
from tests.support.policy import policy_engine, wait_ready

# The first run on a machine builds SmolLM2 (the GGUF's import, its rungs' validation):
# minutes; later runs and fresh clones restore the machine's cached build in seconds.
pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.speed, pytest.mark.timeout(1800)]

ENGLISH = re.compile(r"[A-Za-z]{2,}")
ARITHMETIC = re.compile(r"[0-9][0-9 +=.,]*")


def _precision_records(factory: KafkaFactory) -> list[control_pb2.PrecisionCommand]:
    async def read() -> list[control_pb2.PrecisionCommand]:
        records = await read_to_end(factory, factory.layout.precision(), client_suffix="t-prec")
        commands = [serde.decode(control_pb2.PrecisionCommand, r.value) for r in records if r.value]
        return [c for c in commands if c.model == QOS_MODEL and c.version == QOS_VERSION]

    return asyncio.run(read())


def test_under_the_spike_smollm2_steps_down_a_rung_and_back_up_answering_english(
    settings: Settings,
    factory: KafkaFactory,
    smollm2_gguf: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in {
        "GRAYLANE_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "GRAYLANE_TOPIC_PREFIX": settings.topic_prefix,
        "GRAYLANE_PARTITIONS": str(settings.partitions),
        "GRAYLANE_DB_URL": settings.db_url,
        "GRAYLANE_ARTIFACT_DIR": str(settings.artifact_dir),
    }.items():
        monkeypatch.setenv(name, value)
    build_smollm2_onnx(settings, QOS_MODEL, QOS_VERSION, LADDER, gguf=smollm2_gguf)
    asyncio.run(prepare_topics(settings, PolicyConfig(models=(QOS_MODEL,))))
    asyncio.run(ensure_topics(factory, factory.layout.model_specs(QOS_MODEL, [QOS_VERSION])))
    steps: list[str] = []
    router = start_service(
        "router", ["router", "--model", f"{QOS_MODEL}={QOS_VERSION}"], tmp_path / "logs"
    )
    try:
        with policy_engine(settings, tmp_path / "policy.log", QOS_MODEL):
            asyncio.run(wait_ready(tmp_path / "policy.log"))
            shown, _ = run_qos_act(
                factory, tmp_path / "logs", steps.append, template=chat_template_of(settings)
            )
    finally:
        stop_services([router])

    # the audit: one step down, then one back up, by the policy engine's rules
    assert [(s.before, s.after) for s in shown.steps][:2] == [
        ("fp32", "int8-weight-only"),
        ("int8-weight-only", "fp32"),
    ], steps
    assert shown.stepped_down_s > 0 and shown.stepped_up_s > 0
    # the precision topic the worker obeys says the same, in that order
    variants = [c.variant for c in _precision_records(factory)]
    down = variants.index("int8-weight-only")
    assert "fp32" in variants[down + 1 :], variants
    # the spike and the load came from the capacity measured here
    assert shown.capacity_gps > 0 and shown.rates.spike_gps > shown.capacity_gps
    # generations were served on both rungs, each with real text
    served = {r.variant for r in shown.results if r.ok}
    assert served == set(LADDER), served
    # (English words, or the number a sum such as "What is 3 plus 4?" asks for)
    texts = [r.text for r in shown.results if r.ok]
    unread = [t for t in texts if not (ENGLISH.search(t) or ARITHMETIC.fullmatch(t.strip()))]
    assert texts and not unread, unread
    # the answers shown: fp32, the lower rung, fp32 again; English, from the engine
    assert [a.variant for a in shown.answers] == ["fp32", "int8-weight-only", "fp32"]
    assert all(ENGLISH.search(a.text) for a in shown.answers), shown.answers
    assert "Paris" in shown.answers[0].text
