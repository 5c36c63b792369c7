"""Sampled generation end to end through ONNX Runtime on the demo GPT: seeds, filters,
stop ids and stop strings, on the recompute path and on the KV-cache path."""

from __future__ import annotations

import pytest

from graylane.engine.errors import InvalidInputError
from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine_worker.batch_generation import run_generate
from graylane.engine_worker.kv_decode import (
    FinishReason,
    GenerationResult,
    KvDecodeLoop,
    generate_with_cache,
)
from graylane.engine_worker.logic.sampling import GREEDY, SamplingParams
from graylane.models.byte_vocab import BOS_ID, PAD_ID, encode_text
from tests.support.generation import (
    MAX_SEQ,
    TOKENIZER,
    ascii_pair,
    demo_engine,
    first_new,
    generate,
)

PROMPTS = [
    encode_text("Hello", add_bos=True),
    encode_text("The quick brown fox", add_bos=True),
    encode_text("abc", add_bos=True),
    [BOS_ID],
]
SEEDED = SamplingParams(temperature=1.0, top_p=0.95, seed=1234)


@pytest.fixture(scope="module")
def plain() -> OnnxRuntimeEngine:
    return demo_engine(kv_cache=False)


@pytest.fixture(scope="module")
def cached() -> OnnxRuntimeEngine:
    return demo_engine(kv_cache=True)


@pytest.fixture(params=["plain", "cached"])
def engine(request: pytest.FixtureRequest) -> OnnxRuntimeEngine:
    """Each test runs on the recompute path and on the KV-cache path."""
    return request.getfixturevalue(request.param)  # type: ignore[no-any-return]


# --- seeds ---------------------------------------------------------------------------------


def test_a_seeded_request_draws_the_same_tokens_alone_and_in_any_batch(
    engine: OnnxRuntimeEngine,
) -> None:
    alone = generate(engine, [PROMPTS[0]], 20, SEEDED)[0]
    greedy = generate(engine, [PROMPTS[0]], 20)[0]
    assert alone.finished_reason is FinishReason.LENGTH and len(alone.tokens) == 20
    assert alone.tokens != greedy.tokens  # it did sample
    assert generate(engine, [PROMPTS[0]], 20, SEEDED)[0] == alone  # and again
    others = SamplingParams(temperature=0.8, seed=5)
    batched = generate(
        engine, [PROMPTS[1], PROMPTS[0], PROMPTS[2]], [7, 20, 30], [GREEDY, SEEDED, others]
    )
    reordered = generate(
        engine, [PROMPTS[2], PROMPTS[3], PROMPTS[0]], [30, 3, 20], [others, None, SEEDED]
    )
    assert batched[1] == alone
    assert reordered[2] == alone
    assert batched[2] == reordered[0]  # the other seeded row too
    assert batched[0] == generate(engine, [PROMPTS[1]], 7)[0]  # greedy rows unchanged


def test_seeded_tokens_are_the_same_with_and_without_the_cache(
    plain: OnnxRuntimeEngine, cached: OnnxRuntimeEngine
) -> None:
    params = [SamplingParams(temperature=0.9, top_k=40, seed=s) for s in range(len(PROMPTS))]
    assert generate(plain, PROMPTS, 16, params) == generate(cached, PROMPTS, 16, params)


def test_a_seeded_row_joining_a_running_kv_batch_draws_its_own_tokens(
    cached: OnnxRuntimeEngine,
) -> None:
    alone = generate(cached, [PROMPTS[0]], 12, SEEDED)[0]
    loop = KvDecodeLoop(cached, max_batch_size=2, max_seq_len=MAX_SEQ, pad_id=PAD_ID)
    loop.submit(PROMPTS[1], 20, sampling=SamplingParams(temperature=1.0, seed=9))
    loop.submit(PROMPTS[2], 3)
    done: dict[int, GenerationResult] = {}
    late: int | None = None
    while not loop.idle:
        done.update(loop.step())
        if late is None and len(done) == 1:  # joins the running batch in the freed row
            late = loop.submit(PROMPTS[0], 12, sampling=SEEDED)
    assert late is not None and done[late] == alone


def test_different_seeds_draw_different_tokens(engine: OnnxRuntimeEngine) -> None:
    seeds: list[SamplingParams | None] = [
        SamplingParams(temperature=1.0, seed=s) for s in (1, 2, 3)
    ]
    got = generate(engine, [PROMPTS[0]] * 3, 16, seeds)
    assert len({r.tokens for r in got}) == 3
    unseeded = generate(engine, [PROMPTS[0]] * 2, 16, SamplingParams(temperature=1.0))
    assert unseeded[0].tokens != unseeded[1].tokens


def test_top_k_one_and_a_tiny_top_p_decode_greedily(engine: OnnxRuntimeEngine) -> None:
    greedy = generate(engine, PROMPTS, 12)
    top1 = SamplingParams(temperature=1.5, top_k=1, seed=3)
    nucleus = SamplingParams(temperature=1.5, top_p=1e-6, seed=4)
    assert generate(engine, PROMPTS, 12, top1) == greedy
    assert generate(engine, PROMPTS, 12, nucleus) == greedy


def test_a_low_temperature_concentrates_on_the_likeliest_tokens(
    plain: OnnxRuntimeEngine,
) -> None:
    """The untrained model's logits are flat at temperature 1; at 0.05 sampling is nearly
    greedy, so most tokens agree with greedy decoding."""
    greedy = generate(plain, [PROMPTS[0]], 24)[0].tokens
    cold = generate(plain, [PROMPTS[0]], 24, SamplingParams(temperature=0.05, seed=1))[0].tokens
    warm = generate(plain, [PROMPTS[0]], 24, SamplingParams(temperature=1.0, seed=1))[0].tokens

    def agree(tokens: tuple[int, ...]) -> int:
        return sum(a == b for a, b in zip(tokens, greedy, strict=True))

    assert agree(cold) >= 18 > agree(warm)


# --- stops ---------------------------------------------------------------------------------


def test_a_stop_token_id_finishes_its_row_only(engine: OnnxRuntimeEngine) -> None:
    greedy = generate(engine, PROMPTS[:2], 20)
    j = first_new(greedy[0].tokens, 6)
    stop = SamplingParams(stop_token_ids=(greedy[0].tokens[j], 999))
    got = generate(engine, PROMPTS[:2], 20, [stop, None])
    assert got[0] == GenerationResult(greedy[0].tokens[:j], FinishReason.STOP)
    assert got[1] == greedy[1]
    # EOS stays per row too: the same id as EOS for one row, as nothing for the other.
    eos = generate(engine, PROMPTS[:2], 20, eos=[greedy[0].tokens[j], None])
    assert eos[0] == GenerationResult(greedy[0].tokens[:j], FinishReason.EOS)
    assert eos[1] == greedy[1]


def test_a_stop_string_spanning_tokens_cuts_the_text_before_it(
    engine: OnnxRuntimeEngine,
) -> None:
    greedy = generate(engine, PROMPTS[:2], 30)
    tokens = greedy[0].tokens
    j = ascii_pair(tokens, 2)
    stop = bytes(tokens[j : j + 2]).decode()  # two characters, two tokens
    params = SamplingParams(stop=("never appears \x00", stop))
    got = generate(engine, PROMPTS[:2], 30, [params, None])
    assert got[0].finished_reason is FinishReason.STOP
    assert got[0].text == TOKENIZER.decode(tokens[:j])  # the text ends before the stop
    assert got[0].tokens == tokens[:j]  # the stop string's tokens are dropped
    assert got[1] == greedy[1]  # the batch-mate without stops runs on
    # Stopping on the very token that reaches max_new_tokens is still a stop.
    exact = generate(engine, [PROMPTS[0]], j + 2, params)[0]
    assert (exact.finished_reason, exact.tokens) == (FinishReason.STOP, tokens[:j])


def test_a_seeded_sampled_row_stops_on_its_strings_reproducibly(
    engine: OnnxRuntimeEngine,
) -> None:
    sampled = generate(engine, [PROMPTS[2]], 40, SEEDED)[0].tokens
    j = ascii_pair(sampled, 3)
    stop = bytes(sampled[j : j + 2]).decode()
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=1234, stop=(stop,))
    got = generate(engine, [PROMPTS[1], PROMPTS[2]], 40, [GREEDY, params])[1]
    assert (got.finished_reason, got.tokens) == (FinishReason.STOP, sampled[:j])
    assert got.text == TOKENIZER.decode(sampled[:j])


def test_stop_strings_need_a_decode(plain: OnnxRuntimeEngine, cached: OnnxRuntimeEngine) -> None:
    params = SamplingParams(stop=("\n",))
    with pytest.raises(InvalidInputError, match=r"prompt 0: .*stop strings need"):
        run_generate(plain, [PROMPTS[0]], 4, None, MAX_SEQ, sampling=params)
    with pytest.raises(InvalidInputError, match=r"prompt 0: .*stop strings need"):
        generate_with_cache(cached, [PROMPTS[0]], 4, None, MAX_SEQ, sampling=params)
    loop = KvDecodeLoop(cached, max_batch_size=2, max_seq_len=MAX_SEQ)
    with pytest.raises(InvalidInputError, match="tokenizer"):
        loop.submit(PROMPTS[0], 4, sampling=params)
    assert loop.idle  # nothing was queued
    with pytest.raises(InvalidInputError, match="2 sampling params for 1 prompts"):
        run_generate(plain, [PROMPTS[0]], 4, None, MAX_SEQ, sampling=[GREEDY, GREEDY])
