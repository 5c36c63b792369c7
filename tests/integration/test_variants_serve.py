"""Built variants, loaded through the registry, serve through the request path;
the worker switches between them on precision commands from the compacted topic."""

from __future__ import annotations

from pathlib import Path

import pytest

from graylane import serde
from graylane.app.demo.build_versions import build_versions
from graylane.artifacts.verify import TamperedArtifactError
from graylane.client import GraylaneClient
from graylane.engine_worker.loading import load_from_registry
from graylane.kafka.seam import KafkaFactory
from graylane.registry.repository import open_registry
from graylane.serde import PostProcess
from graylane.settings import Settings
from graylane.v1 import control_pb2
from tests.support.stack import running_stack
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MODEL = "demo-gpt"


def build_tiny(settings: Settings) -> Path:
    build_versions(
        settings,
        MODEL,
        {"1.0.0": 3},
        size="tiny",
        precisions=("fp32", "fp16", "int8", "int8-dynamic"),
    )
    return settings.artifact_dir


async def test_every_servable_variant_serves_and_precision_switches(
    settings: Settings,
) -> None:
    build_tiny(settings)
    loaded = load_from_registry(settings, MODEL, "1.0.0", intra_op_threads=1)
    servable = [
        a for a in open_registry(settings.db_url).list_artifacts(MODEL, "1.0.0") if a.servable
    ]
    assert {a.precision.value for a in servable} == set(loaded.engines)
    assert "fp32" in loaded.engines and len(loaded.engines) >= 3
    factory = KafkaFactory(settings)
    async with running_stack(
        factory,
        model=MODEL,
        versions={"1.0.0": loaded.fp32_path},
        stable="1.0.0",
        engines={"1.0.0": loaded.engines},
    ) as stack:
        worker = stack.workers["1.0.0"]
        producer = factory.producer()
        await producer.start()
        async with GraylaneClient(factory) as client:
            for epoch, variant in enumerate(loaded.engines, start=1):
                command = control_pb2.PrecisionCommand(
                    model=MODEL, version="1.0.0", variant=variant, epoch=epoch, reason="test"
                )
                await producer.send_and_wait(
                    factory.layout.precision(),
                    serde.encode(command),
                    key=factory.layout.precision_key(MODEL, "1.0.0").encode(),
                )
                await wait_until(
                    lambda e=epoch: worker.precision_epoch >= e, timeout=10, what="precision epoch"
                )
                assert worker.active_variant == variant
                result = await client.infer(
                    MODEL, prompt="variants serve", post_process=PostProcess.ARGMAX_LAST, timeout=30
                )
                assert result.ok and result.variant == variant
                assert result.outputs["token_ids"].shape == (1,)
            # An older epoch never overrides a newer one. The worker serves another variant
            # than the stale command names, so applying it would visibly switch back; every
            # command the worker reads from here on is recorded with the state it leaves.
            before = worker.active_variant
            assert before != "fp32"
            seen: list[tuple[str, int, str]] = []
            apply = worker.apply_precision

            def recording(command: control_pb2.PrecisionCommand) -> bool:
                applied = apply(command)
                seen.append((command.reason, worker.precision_epoch, worker.active_variant))
                return applied

            worker.apply_precision = recording  # type: ignore[method-assign]
            stale = control_pb2.PrecisionCommand(
                model=MODEL, version="1.0.0", variant="fp32", epoch=1, reason="stale"
            )
            await producer.send_and_wait(
                factory.layout.precision(),
                serde.encode(stale),
                key=factory.layout.precision_key(MODEL, "1.0.0").encode(),
            )
            # A newer command after it on the same key, to a third variant: once it is
            # applied, the stale one has been read (same partition, in order).
            third = next(v for v in loaded.engines if v not in (before, "fp32"))
            fence = control_pb2.PrecisionCommand(
                model=MODEL, version="1.0.0", variant=third, epoch=epoch + 1, reason="fence"
            )
            await producer.send_and_wait(
                factory.layout.precision(),
                serde.encode(fence),
                key=factory.layout.precision_key(MODEL, "1.0.0").encode(),
            )
            await wait_until(
                lambda: worker.precision_epoch == epoch + 1, timeout=10, what="fence applied"
            )
            assert worker.active_variant == third
            # the stale command was read and changed nothing: neither variant nor epoch
            assert [s for s in seen if s[0] == "stale"] == [("stale", epoch, before)]
        await producer.stop()


def test_a_tampered_artifact_is_refused_by_the_worker(settings: Settings) -> None:
    store = build_tiny(settings)
    victim = next(store.glob("*-fp16-*/model.onnx"))
    victim.write_bytes(victim.read_bytes()[:-1] + b"\x00")
    with pytest.raises(TamperedArtifactError, match=str(victim.parent.name)):
        load_from_registry(settings, MODEL, "1.0.0")
