from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import pytest

from graylane.engine.derived_inputs import POSITION_IDS
from graylane.engine.errors import InvalidInputError
from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine.protocol import InferenceEngine
from graylane.engine.signature import IOSignature, TensorSpec
from graylane.engine_worker.batch_generation import run_generate
from graylane.engine_worker.kv_decode import (
    FinishReason,
    GenerationResult,
    KvDecodeLoop,
    generate_with_cache,
)
from graylane.engine_worker.layouts import generation_layout, kv_cache_layout, token_layout
from graylane.models.byte_vocab import BOS_ID, PAD_ID, VOCAB_SIZE
from graylane.models.demo_gpt import build_demo_gpt
from tests.support.engines import DelegatingEngine

MAX_SEQ = 64
RNG = np.random.default_rng(3)
PROMPTS = [
    [BOS_ID, *(int(t) for t in RNG.integers(32, 127, n))] for n in (0, 4, 17, 2, 30, 9, 40, 11)
]
LIMITS = [12, 3, 20, 7, 25, 1, 30, 16]


@pytest.fixture(scope="module")
def plain() -> OnnxRuntimeEngine:
    model = build_demo_gpt("tiny", seed=0).SerializeToString()
    return OnnxRuntimeEngine.load(model, name="tiny", intra_op_threads=1)


@pytest.fixture(scope="module")
def cached() -> OnnxRuntimeEngine:
    model = build_demo_gpt("tiny", seed=0, kv_cache=True).SerializeToString()
    return OnnxRuntimeEngine.load(model, name="tiny-kv", intra_op_threads=1)


@pytest.fixture(scope="module")
def reference(plain: OnnxRuntimeEngine) -> list[GenerationResult]:
    """The full-recompute path, no EOS."""
    return run_generate(plain, PROMPTS, LIMITS, None, MAX_SEQ, pad_id=PAD_ID)


class RecordingEngine(DelegatingEngine):
    """Delegates to a real engine; records input shapes, optionally checks/strips position_ids."""

    def __init__(self, inner: InferenceEngine, *, with_positions: bool = False) -> None:
        super().__init__(inner)
        self.shapes: list[dict[str, tuple[int, ...]]] = []
        self.with_positions = with_positions
        extra = (TensorSpec(name=POSITION_IDS, dtype=np.dtype(np.int64), shape=("b", "s")),)
        self._io = IOSignature(
            inputs=inner.io.inputs + (extra if with_positions else ()), outputs=inner.io.outputs
        )

    @property
    def io(self) -> IOSignature:
        return self._io

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.shapes.append({k: v.shape for k, v in feeds.items()})
        feeds = dict(feeds)
        if self.with_positions:
            mask, ids = feeds["attention_mask"], feeds["input_ids"]
            positions = feeds.pop(POSITION_IDS)
            # Each real new token's position = real tokens before it.
            real = mask[:, -ids.shape[1] :] != 0
            before = np.cumsum(mask, axis=1)[:, -ids.shape[1] :] - 1
            assert (positions[real] == before[real]).all()
        return self.inner.run(feeds)


# --- layout detection ---------------------------------------------------------------


def test_cache_layout_is_read_from_the_io_signature(
    plain: OnnxRuntimeEngine, cached: OnnxRuntimeEngine
) -> None:
    layout = kv_cache_layout(cached.io)
    assert layout is not None
    assert (layout.n_layers, layout.n_heads, layout.head_dim) == (2, 4, 32)
    assert layout.tokens.vocab_size is None  # declared by the model's info, never read from logits
    assert layout.past_names[:2] == ("past_key_values.0.key", "past_key_values.0.value")
    assert layout.present_names[-1] == "present.1.value"
    assert not layout.position_ids
    assert kv_cache_layout(plain.io) is None
    # A forward pass runs it as a token model whose past is derived (empty), never requested.
    forward = token_layout(cached.io)
    assert forward == layout.tokens and set(forward.derived) == set(layout.past_names)
    # Request validation sees both forms as token models with the same ids and vocabulary.
    assert generation_layout(cached.io) == layout.tokens
    assert replace(layout.tokens, derived=()) == token_layout(plain.io)


def test_an_incomplete_cache_signature_is_not_a_cache_model(cached: OnnxRuntimeEngine) -> None:
    io = cached.io
    no_value = IOSignature(
        inputs=tuple(s for s in io.inputs if s.name != "past_key_values.1.value"),
        outputs=io.outputs,
    )
    assert kv_cache_layout(no_value) is None
    no_present = IOSignature(
        inputs=io.inputs, outputs=tuple(s for s in io.outputs if s.name != "present.0.key")
    )
    assert kv_cache_layout(no_present) is None
    token_types = TensorSpec(name="token_type_ids", dtype=np.dtype(np.int64), shape=("b", "s"))
    extra = IOSignature(
        inputs=(*io.inputs, token_types),
        outputs=io.outputs,
    )
    assert kv_cache_layout(extra) is None


# --- equivalence with the full-recompute path ---------------------------------------


@pytest.mark.parametrize("rows", [8, 3, 1])
def test_greedy_tokens_equal_full_recompute_for_mixed_lengths(
    cached: OnnxRuntimeEngine, reference: list[GenerationResult], rows: int
) -> None:
    # rows=8: one batch, rows leave at different steps; rows<8: waiting prompts join as they do.
    got = generate_with_cache(
        cached, PROMPTS, LIMITS, None, MAX_SEQ, pad_id=PAD_ID, max_batch_size=rows
    )
    assert got == reference
    assert [len(r.tokens) for r in got] == [
        min(limit, MAX_SEQ - len(p)) for p, limit in zip(PROMPTS, LIMITS, strict=True)
    ]


def test_eos_and_max_seq_finish_rows_at_different_steps(
    plain: OnnxRuntimeEngine, cached: OnnxRuntimeEngine, reference: list[GenerationResult]
) -> None:
    # An EOS that some rows emit midway (and others never), and a max_seq_len that cuts the longest.
    counts: dict[int, int] = {}
    for r in reference:
        for t in set(r.tokens[1:]):
            counts[t] = counts.get(t, 0) + 1
    eos = max(counts, key=lambda t: (counts[t], -t))
    max_seq = 50
    expected = run_generate(plain, PROMPTS, LIMITS, eos, max_seq, pad_id=PAD_ID)
    reasons = {r.finished_reason for r in expected}
    assert reasons == {FinishReason.EOS, FinishReason.LENGTH, FinishReason.MAX_SEQ}
    recorder = RecordingEngine(cached)
    got = generate_with_cache(recorder, PROMPTS, LIMITS, eos, max_seq, pad_id=PAD_ID)
    assert got == expected
    # One prefill, then one single-token step per token while any row runs; rows drop out.
    assert recorder.shapes[0]["input_ids"] == (len(PROMPTS), max(map(len, PROMPTS)))
    assert all(s["input_ids"][1] == 1 for s in recorder.shapes[1:])
    # The prefill gives each row its first token; a row then needs one step per further
    # token (plus the step that produced its EOS) and is gone from the steps after that.
    needs = [len(r.tokens) - 1 + (r.finished_reason is FinishReason.EOS) for r in got]
    decode_rows = [s["input_ids"][0] for s in recorder.shapes[1:]]
    assert decode_rows == [sum(n > step for n in needs) for step in range(max(needs))]


def test_requests_join_and_leave_the_running_batch_between_steps(
    cached: OnnxRuntimeEngine, reference: list[GenerationResult]
) -> None:
    recorder = RecordingEngine(cached)
    loop = KvDecodeLoop(recorder, max_batch_size=2, max_seq_len=MAX_SEQ, pad_id=PAD_ID)
    first = loop.submit(PROMPTS[1], LIMITS[1])  # 3 tokens
    second = loop.submit(PROMPTS[2], LIMITS[2])  # 20 tokens
    third = loop.submit(PROMPTS[3], LIMITS[3])  # waits for a free row
    done: dict[int, GenerationResult] = {}
    running_after: list[tuple[int, ...]] = []
    late: int | None = None
    while not loop.idle:
        done.update(loop.step())
        running_after.append(loop.scheduler.running)
        if len(running_after) == 4:
            late = loop.submit(PROMPTS[5], LIMITS[5])  # arrives while the batch runs
    assert late is not None
    assert done[first] == reference[1]
    assert done[second] == reference[2]
    assert done[third] == reference[3]
    assert done[late] == reference[5]
    # The short request left after its third token and the waiting one took its row
    # at once, while the long one kept running.
    assert running_after[:3] == [(first, second), (second,), (second, third)]
    assert loop.stats.prefill_calls == 3  # first two together, then one per joiner
    assert max(s["input_ids"][0] for s in recorder.shapes) <= 2


def test_holes_from_joins_are_compacted_without_changing_tokens(
    cached: OnnxRuntimeEngine, reference: list[GenerationResult]
) -> None:
    # The 41-token prompt fills the cache; short prompts joining later leave long holes.
    order = [6, 0, 3, 5, 1, 7]
    loop = KvDecodeLoop(cached, max_batch_size=2, max_seq_len=MAX_SEQ, pad_id=PAD_ID)
    ids = {loop.submit(PROMPTS[i], LIMITS[i]): i for i in order}
    results = loop.run()
    assert loop.stats.compactions >= 1
    for seq_id, i in ids.items():
        assert results[seq_id] == reference[i]


@pytest.mark.parametrize("rows", [8, 2])
def test_every_step_sees_the_logits_of_a_full_forward(
    plain: OnnxRuntimeEngine, cached: OnnxRuntimeEngine, rows: int
) -> None:
    # Greedy tokens of an untrained model hardly depend on context, so check the logits
    # each token is chosen from: a stale or misplaced cache entry changes them.
    seen: dict[int, list[np.ndarray]] = {}
    loop = KvDecodeLoop(
        cached,
        max_batch_size=rows,
        max_seq_len=MAX_SEQ,
        pad_id=PAD_ID,
        on_logits=lambda seq_id, logits: seen.setdefault(seq_id, []).append(logits.copy()),
    )
    order = [6, 0, 3, 5, 1, 7, 2, 4]  # rows=2: long prompt first, so joiners leave holes
    ids = {loop.submit(PROMPTS[i], LIMITS[i]): i for i in order}
    results = loop.run()
    assert rows == 8 or loop.stats.compactions >= 1
    for seq_id, i in ids.items():
        prompt, tokens = PROMPTS[i], list(results[seq_id].tokens)
        ids_row = np.array([prompt + tokens], dtype=np.int64)
        full = plain.run({"input_ids": ids_row, "attention_mask": np.ones_like(ids_row)})
        expected = full["logits"][0, len(prompt) - 1 : len(prompt) - 1 + len(seen[seq_id])]
        assert len(seen[seq_id]) == len(tokens)
        np.testing.assert_allclose(np.stack(seen[seq_id]), expected, atol=1e-4, rtol=0)


def test_position_ids_follow_the_mask_when_the_model_takes_them(
    cached: OnnxRuntimeEngine, reference: list[GenerationResult]
) -> None:
    recorder = RecordingEngine(cached, with_positions=True)
    layout = kv_cache_layout(recorder.io)
    assert layout is not None and layout.position_ids
    got = generate_with_cache(recorder, PROMPTS, LIMITS, None, MAX_SEQ, max_batch_size=3)
    assert got == reference


def test_zero_tokens_and_full_prompts_finish_without_running(cached: OnnxRuntimeEngine) -> None:
    recorder = RecordingEngine(cached)
    got = generate_with_cache(recorder, [[BOS_ID], [BOS_ID] * 16], [0, 5], None, 16)
    assert got == [
        GenerationResult((), FinishReason.LENGTH),
        GenerationResult((), FinishReason.MAX_SEQ),
    ]
    assert recorder.shapes == []
    assert generate_with_cache(cached, [], 3, None, 16) == []


def test_bad_arguments_are_refused(plain: OnnxRuntimeEngine, cached: OnnxRuntimeEngine) -> None:
    with pytest.raises(InvalidInputError, match="prompt 0"):
        generate_with_cache(cached, [[]], 3, None, 32)
    with pytest.raises(InvalidInputError):
        generate_with_cache(cached, [[BOS_ID] * 40], 3, None, 32)
    with pytest.raises(InvalidInputError):
        generate_with_cache(cached, [[BOS_ID], [BOS_ID]], [1], None, 32)
    with pytest.raises(InvalidInputError):
        generate_with_cache(cached, [[BOS_ID, VOCAB_SIZE]], 1, None, 32)
    with pytest.raises(InvalidInputError):
        generate_with_cache(cached, [[BOS_ID]], -1, None, 32)
    with pytest.raises(InvalidInputError, match="past_key_values"):
        generate_with_cache(plain, [[BOS_ID]], 1, None, 32)


def test_the_worker_generate_path_uses_the_cache_with_the_same_tokens(
    cached: OnnxRuntimeEngine, reference: list[GenerationResult]
) -> None:
    """``run_generate`` (what the worker calls) takes the KV path for a cached model."""
    from graylane.engine_worker import batch_generation

    calls: list[int] = []
    original = batch_generation.generate_with_cache

    def spy(*args: object, **kwargs: object) -> list[GenerationResult]:
        calls.append(1)
        return original(*args, **kwargs)  # type: ignore[arg-type]

    batch_generation.generate_with_cache = spy  # type: ignore[assignment]
    try:
        got = batch_generation.run_generate(cached, PROMPTS, LIMITS, None, MAX_SEQ, pad_id=PAD_ID)
    finally:
        batch_generation.generate_with_cache = original  # type: ignore[assignment]
    assert calls == [1]
    assert [r.tokens for r in got] == [r.tokens for r in reference]
