"""A token tagger (54 input symbols, 15 classes, an output called ``logits``) goes
build → registry → a real worker on the real broker → forward.

Regression: the worker took the vocabulary from the width of ``logits`` and refused
every id above 14 with ENGINE_FAILURE, failing the bad request's batch-mates too.
"""

from __future__ import annotations

import asyncio

import pytest

from graylane.builder.build import run_build
from graylane.builder.spec import parse_spec
from graylane.client import GraylaneClient, RequestRejected, Task
from graylane.engine_worker.loading import load_from_registry
from graylane.kafka.seam import KafkaFactory
from graylane.registry.repository import open_registry
from graylane.settings import Settings
from tests.support.small_models import TAGGER_CLASSES, write_tagger
from tests.support.stack import running_stack

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MODEL = "tagger"


async def test_a_tagger_serves_every_valid_id_and_fails_only_the_bad_request(
    settings: Settings,
) -> None:
    source = write_tagger(settings.artifact_dir.parent / "tagger.onnx")
    spec = parse_spec(
        {
            "model": MODEL,
            "version": "1.0.0",
            "source": str(source),
            "task": "token-classification",
            "precisions": ["fp32"],
        },
        source.parent,
    )
    report = run_build(spec, store=settings.artifact_dir, registry=open_registry(settings.db_url))
    assert report.ok and report.registered
    loaded = load_from_registry(settings, MODEL, "1.0.0", intra_op_threads=1)
    assert loaded.model_info is not None and loaded.model_info.vocab_size == 54
    factory = KafkaFactory(settings)
    async with (
        running_stack(
            factory,
            model=MODEL,
            versions={"1.0.0": loaded.fp32_path},  # type: ignore[dict-item]
            stable="1.0.0",
            max_seq_len=64,
            engines={"1.0.0": loaded.engines},
            model_info=loaded.model_info,
        ),
        GraylaneClient(factory) as client,
    ):
        good = [[0, 20, 53], [53, 52, 51], [14, 15, 16]]
        results = await asyncio.gather(
            *(client.infer(MODEL, token_ids=ids, timeout=60) for ids in good),
            client.infer(MODEL, token_ids=[1, 54, 2], timeout=60),
            return_exceptions=True,
        )
        *served, bad = results
        for result in served:
            assert not isinstance(result, BaseException), result
            assert result.ok and result.outputs["logits"].shape == (1, 3, TAGGER_CLASSES)
        assert isinstance(bad, RequestRejected), bad
        assert bad.result.error_code == "BAD_REQUEST" and "54" in bad.result.error_message
        with pytest.raises(RequestRejected) as refused:
            await client.infer(
                MODEL, token_ids=[1, 2], task=Task.GENERATE, max_new_tokens=2, timeout=60
            )
        assert refused.value.result.error_code == "UNSUPPORTED_TASK"
