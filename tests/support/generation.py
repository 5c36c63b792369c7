"""The demo GPT for sampled-generation tests: its engines, and helpers that pick stop
ids and stop strings out of what it really generates."""

from __future__ import annotations

from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine_worker.batch_generation import run_generate
from graylane.engine_worker.kv_decode import GenerationResult
from graylane.engine_worker.logic.sampling import SamplingParams
from graylane.engine_worker.requests import DemoByteTokenizer
from graylane.models.byte_vocab import PAD_ID
from graylane.models.demo_gpt import build_demo_gpt

__all__ = ["MAX_SEQ", "TOKENIZER", "ascii_pair", "demo_engine", "first_new", "generate"]

MAX_SEQ = 64
TOKENIZER = DemoByteTokenizer()


def demo_engine(*, kv_cache: bool) -> OnnxRuntimeEngine:
    """The tiny demo GPT (seed 0) on ONNX Runtime, with or without its KV cache."""
    model = build_demo_gpt("tiny", seed=0, kv_cache=kv_cache).SerializeToString()
    return OnnxRuntimeEngine.load(model, name="tiny-kv" if kv_cache else "tiny", intra_op_threads=1)


def generate(
    engine: OnnxRuntimeEngine,
    prompts: list[list[int]],
    limit: int | list[int],
    sampling: SamplingParams | list[SamplingParams | None] | None = None,
    eos: int | list[int | None] | None = None,
) -> list[GenerationResult]:
    """:func:`run_generate` as the worker calls it, with the demo tokenizer's decode."""
    return run_generate(
        engine,
        prompts,
        limit,
        eos,
        MAX_SEQ,
        pad_id=PAD_ID,
        sampling=sampling,
        decode=TOKENIZER.decode,
    )


def first_new(tokens: tuple[int, ...], start: int) -> int:
    """A position at or after ``start`` whose token did not occur before it."""
    return next(j for j in range(start, len(tokens)) if tokens[j] not in tokens[:j])


def ascii_pair(tokens: tuple[int, ...], start: int) -> int:
    """A position at or after ``start`` where two printable ASCII tokens follow one
    another for the first time (so a two-character stop string first appears there)."""
    text = TOKENIZER.decode
    for j in range(start, len(tokens) - 1):
        pair = bytes(tokens[j : j + 2])
        if all(32 <= t < 127 for t in tokens[j : j + 2]) and pair.decode() not in text(
            tokens[: j + 1]
        ):
            return j
    raise AssertionError(f"no two ASCII tokens in a row in {tokens}")
