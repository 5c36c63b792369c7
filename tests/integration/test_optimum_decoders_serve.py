"""Decoders exported by Hugging Face Optimum go ``graylane build`` → registry → a real worker
on the real broker, and answer text prompts exactly as transformers did.

Each fixture (``tests/fixtures/llm``) is built with its ``tokenizer.json`` into fp32 and
int8 variants (the merged decoder into fp32 only: ONNX Runtime's quantizers cannot
reach the weights its ``If`` branches read, see tests/unit/test_optimum_builds.py),
loaded back through the registry (files checked against their manifests, the
tokenizer found in the artifact), and served through router and worker to the SDK:
GENERATE on a text prompt gives transformers' greedy tokens and text, FORWARD the
argmax of its last logits. The int8 variant then serves the same requests; its
agreement with fp32 is printed, not held to a bar: the fixtures are untrained.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from graylane import serde
from graylane.builder.build import run_build
from graylane.builder.spec import parse_spec
from graylane.client import GraylaneClient, Result, Task
from graylane.engine_worker.loading import load_from_registry
from graylane.kafka.seam import KafkaFactory
from graylane.registry.repository import open_registry
from graylane.serde import PostProcess
from graylane.settings import Settings
from graylane.v1 import control_pb2
from tests.support.llm_fixtures import Fixture, fixture
from tests.support.stack import Stack, running_stack
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

VERSION = "1.0.0"


def spec(fx: Fixture, precisions: list[str]) -> dict[str, object]:
    return {
        "model": f"optimum-{fx.arch}",
        "version": VERSION,
        "source": str(fx.model),
        "tokenizer": str(fx.tokenizer),
        "precisions": precisions,
        "calibration": {
            "generator": "text",
            "samples": 32,
            "batch_size": 8,
            "seq_len": 32,
            "min_samples": 32,
            "method": "minmax",
        },
        "validation": {
            "generator": "text",
            "samples": 16,
            "seed": 1,
            "batch_size": 8,
            "seq_len": 32,
            "generation": {"prompts": 4, "new_tokens": 8},
        },
        # Untrained fixtures have near-tied logits: this pins building and serving int8,
        # not its accuracy (the agreement is printed below).
        "tolerances": {
            "int8": {"min_cosine": 0.9, "min_top1_agreement": 0.5, "min_token_agreement": 0.0}
        },
        "partial_quantization": {"enabled": False},
        "tensorrt": {"enabled": False},
    }


async def ask(client: GraylaneClient, model: str, fx: Fixture) -> tuple[list[Result], list[Result]]:
    generated = await asyncio.gather(
        *(
            client.infer(
                model,
                prompt=p.text,
                task=Task.GENERATE,
                max_new_tokens=fx.max_new_tokens,
                timeout=60,
            )
            for p in fx.prompts
        )
    )
    forwards = await asyncio.gather(
        *(
            client.infer(model, prompt=p.text, post_process=PostProcess.ARGMAX_LAST, timeout=60)
            for p in fx.prompts
        )
    )
    return list(generated), list(forwards)


async def switch_to(stack: Stack, model: str, variant: str) -> None:
    factory = stack.factory
    producer = factory.producer()
    await producer.start()
    try:
        command = control_pb2.PrecisionCommand(
            model=model, version=VERSION, variant=variant, epoch=1, reason="test"
        )
        await producer.send_and_wait(
            factory.layout.precision(),
            serde.encode(command),
            key=factory.layout.precision_key(model, VERSION).encode(),
        )
    finally:
        await producer.stop()
    worker = stack.workers[VERSION]
    await wait_until(lambda: worker.active_variant == variant, timeout=15, what="precision switch")


@pytest.mark.parametrize("arch", ["gpt2", "llama", "gpt2-merged"])
async def test_an_optimum_decoder_serves_text_like_transformers(
    settings: Settings, arch: str, tmp_path: Path
) -> None:
    fx = fixture(arch)
    merged = arch == "gpt2-merged"
    precisions = ["fp32"] if merged else ["fp32", "int8"]
    report = run_build(
        parse_spec(spec(fx, precisions), tmp_path),
        store=settings.artifact_dir,
        registry=open_registry(settings.db_url),
    )
    assert report.ok and report.registered, report
    loaded = load_from_registry(settings, f"optimum-{arch}", VERSION, intra_op_threads=1)
    assert set(loaded.engines) == set(precisions)
    assert loaded.tokenizer is not None and loaded.tokenizer.eos_id == fx.eos_token_id
    assert loaded.model_info is not None and loaded.model_info.generates
    assert loaded.model_info.vocab_size == 512
    model = f"optimum-{arch}"
    factory = KafkaFactory(settings)
    async with (
        running_stack(
            factory,
            model=model,
            versions={VERSION: loaded.fp32_path},  # type: ignore[dict-item]
            stable=VERSION,
            max_seq_len=128,
            engines={VERSION: loaded.engines},
            model_info=loaded.model_info,
            tokenizer=loaded.tokenizer,
        ) as stack,
        GraylaneClient(factory) as client,
    ):
        generated, forwards = await ask(client, model, fx)
        for result, p in zip(generated, fx.prompts, strict=True):
            assert result.ok and result.variant == "fp32", result
            assert result.tokens == p.generated
            assert result.text == p.generated_text
        for result, p in zip(forwards, fx.prompts, strict=True):
            assert result.ok, result
            assert result.outputs["token_ids"].tolist() == [p.argmax_last]
        if merged:
            return
        await switch_to(stack, model, "int8")
        quantized, quantized_forwards = await ask(client, model, fx)
    assert all(r.ok and r.variant == "int8" for r in (*quantized, *quantized_forwards))
    same_tokens = sum(
        a == b
        for q, f in zip(quantized, generated, strict=True)
        for a, b in zip(q.tokens, f.tokens, strict=False)
    )
    total = sum(len(f.tokens) for f in generated)
    same_argmax = sum(
        q.outputs["token_ids"].tolist() == f.outputs["token_ids"].tolist()
        for q, f in zip(quantized_forwards, forwards, strict=True)
    )
    int8 = next(v for v in report.variants if v.precision.value == "int8")
    metrics = int8.validation.metrics if int8.validation else None
    print(
        f"\n{arch} int8 vs fp32 served: greedy tokens {same_tokens}/{total} position-wise, "
        f"last-position argmax {same_argmax}/{len(forwards)}; build validation: "
        + (
            f"cosine {metrics.cosine:.4f}, top-1 {metrics.top1_agreement:.3f}, "
            f"tokens {metrics.token_agreement}"
            if metrics
            else "none"
        )
    )
