"""Signed artifacts on the request path: a worker that trusts the builder's key refuses
unsigned, tampered and foreign-signed artifacts (error, metric, never served) and serves
the signed one through the real broker and ONNX Runtime."""

from __future__ import annotations

from pathlib import Path

import pytest

from graylane import serde
from graylane.app.demo.build_versions import build_versions
from graylane.artifacts.signing import (
    SIGNATURE_FILE,
    SignatureFailure,
    generate_key_pair,
    sign_artifact,
)
from graylane.client import GraylaneClient
from graylane.engine_worker.loading import NoServableVariant, load_from_registry
from graylane.kafka.seam import KafkaFactory
from graylane.registry.repository import open_registry
from graylane.serde import PostProcess
from graylane.settings import Settings
from graylane.v1 import control_pb2
from tests.support.stack import running_stack
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MODEL = "signed-gpt"
VERSION = "1.0.0"


async def test_a_worker_refuses_unsigned_and_tampered_artifacts_and_serves_the_signed_one(
    settings: Settings, tmp_path: Path
) -> None:
    builder = generate_key_pair(tmp_path / "keys" / "builder.pem")
    foreign = generate_key_pair(tmp_path / "keys" / "foreign.pem")
    build_versions(
        settings.with_overrides(signing_key=builder.private_key),
        MODEL,
        {VERSION: 3},
        size="tiny",
        precisions=("fp32", "fp16", "int8", "int8-dynamic"),
        progress=lambda _: None,
    )
    folders = {
        a.precision.value: settings.artifact_dir / a.path
        for a in open_registry(settings.db_url).list_artifacts(MODEL, VERSION)
        if a.servable
    }
    assert all((f / SIGNATURE_FILE).is_file() for f in folders.values())  # all signed
    assert {"fp32", "fp16", "int8-dynamic"} <= set(folders)
    # fp16 loses its signature; int8-dynamic gains a file no manifest check looks at (a
    # tokenizer a worker would load); int8, when servable, is re-signed by another key.
    (folders["fp16"] / SIGNATURE_FILE).unlink()
    (folders["int8-dynamic"] / "tokenizer.json").write_text('{"model": {"vocab": {}}}')
    expected = {"fp16": SignatureFailure.UNSIGNED, "int8-dynamic": SignatureFailure.TAMPERED}
    if "int8" in folders:
        sign_artifact(folders["int8"], foreign.private_key)
        expected["int8"] = SignatureFailure.UNTRUSTED_KEY

    # Without trusted keys nothing changes: every servable variant loads.
    unchecked = load_from_registry(settings, MODEL, VERSION, intra_op_threads=1)
    assert set(unchecked.engines) == set(folders) and unchecked.refused == ()

    trusting = settings.with_overrides(trusted_keys=(builder.public_key,))
    loaded = load_from_registry(trusting, MODEL, VERSION, intra_op_threads=1)
    assert set(loaded.engines) == {"fp32"}
    refused = {r.artifact: r for r in loaded.refused}
    assert len(refused) == len(expected)
    for precision, reason in expected.items():
        name = next(n for n in refused if f"-{precision}-" in n)
        assert refused[name].reason is reason
        assert str(folders[precision]) in refused[name].message
        assert loaded.skipped[name] == refused[name].message
    assert "tokenizer.json was added" in next(
        r.message for r in refused.values() if r.reason is SignatureFailure.TAMPERED
    )

    factory = KafkaFactory(settings)
    async with running_stack(
        factory,
        model=MODEL,
        versions={VERSION: loaded.fp32_path},
        stable=VERSION,
        engines={VERSION: loaded.engines},
        refused_artifacts=loaded.refused,
    ) as stack:
        worker = stack.workers[VERSION]
        for reason in {r.reason for r in loaded.refused}:
            count = worker.registry.get_sample_value(
                "graylane_artifact_verification_failures_total",
                {"model": MODEL, "version": VERSION, "reason": reason.value},
            )
            assert count == sum(r.reason is reason for r in loaded.refused)
        async with GraylaneClient(factory) as client:
            result = await client.infer(
                MODEL, prompt="signed serves", post_process=PostProcess.ARGMAX_LAST, timeout=30
            )
            assert result.ok and result.variant == "fp32"
            assert result.outputs["token_ids"].shape == (1,)
            # A command to switch to a refused variant is read and changes nothing.
            seen: list[tuple[str, bool]] = []
            apply = worker.apply_precision

            def recording(command: control_pb2.PrecisionCommand) -> bool:
                applied = apply(command)
                seen.append((command.variant, applied))
                return applied

            worker.apply_precision = recording  # type: ignore[method-assign]
            producer = factory.producer()
            await producer.start()
            try:
                await producer.send_and_wait(
                    factory.layout.precision(),
                    serde.encode(
                        control_pb2.PrecisionCommand(
                            model=MODEL, version=VERSION, variant="fp16", epoch=1, reason="test"
                        )
                    ),
                    key=factory.layout.precision_key(MODEL, VERSION).encode(),
                )
            finally:
                await producer.stop()
            await wait_until(lambda: bool(seen), timeout=10, what="precision command read")
            assert seen == [("fp16", False)] and worker.active_variant == "fp32"
            again = await client.infer(
                MODEL, prompt="still signed", post_process=PostProcess.ARGMAX_LAST, timeout=30
            )
            assert again.ok and again.variant == "fp32"

    # A worker that trusts only a key none of them was signed with serves nothing at all.
    stranger = generate_key_pair(tmp_path / "keys" / "stranger.pem")
    with pytest.raises(NoServableVariant, match="not trusted"):
        load_from_registry(
            settings.with_overrides(trusted_keys=(stranger.public_key,)), MODEL, VERSION
        )
