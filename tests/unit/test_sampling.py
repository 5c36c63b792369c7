"""Token sampling and stop strings, pure: params checks, the distribution, the draw, cuts.

Logits here are hand-written or drawn vectors (no model): these tests are about the
sampler's arithmetic. Decoding through a real model is in ``test_generate_sampling``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from graylane.engine_worker.logic.sampling import (
    GREEDY,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    SamplingError,
    SamplingParams,
    StopStrings,
    TokenSampler,
    next_token_probs,
    tokens_before,
)
from graylane.errors import ErrorCode

# Small integer-valued logits make ties common: tie-breaking is part of the contract.
TIED_LOGITS = arrays(np.float32, st.integers(1, 40), elements=st.integers(-4, 4).map(float))
LOGITS = arrays(
    np.float32,
    st.integers(1, 60),
    elements=st.floats(-30, 30, allow_nan=False, width=32),
)
TEMPERATURES = st.floats(0.05, 5.0)


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    seen = expected > 0
    assert counts[~seen].sum() == 0, "drew a token of probability 0"
    return float((((counts - expected) ** 2)[seen] / expected[seen]).sum())


def draw_counts(params: SamplingParams, logits: np.ndarray, n: int) -> np.ndarray:
    sampler = TokenSampler(params)
    counts = np.zeros(logits.size, dtype=np.int64)
    for _ in range(n):
        counts[sampler.choose(logits)] += 1
    return counts


# Upper 0.1% points of chi-square: a correct sampler fails one seed in a thousand.
CHI2_999 = {3: 16.27, 4: 18.47, 5: 20.52}


# --- params ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"temperature": -0.1}, "temperature must be >= 0"),
        ({"temperature": math.nan}, "temperature must be a finite number"),
        ({"temperature": math.inf}, "temperature must be a finite number"),
        ({"top_p": 1.5}, "top_p must be in [0, 1]"),
        ({"top_p": -0.01}, "top_p must be in [0, 1]"),
        ({"top_p": math.nan}, "top_p must be a finite number"),
        ({"top_k": -1}, "top_k must be >= 0"),
        ({"seed": -1}, "seed must be in [0, 2**64)"),
        ({"seed": 2**64}, "seed must be in [0, 2**64)"),
        ({"stop_token_ids": (3, -2)}, "stop_token_ids must be ids >= 0"),
        ({"stop_token_ids": tuple(range(MAX_STOP_TOKEN_IDS + 1))}, "stop_token_ids; the limit"),
        ({"stop": ("x",) * (MAX_STOP_STRINGS + 1)}, "stop strings; the limit is 16"),
        ({"stop": ("ok", "y" * (MAX_STOP_CHARS + 1))}, "65 characters; the limit is 64"),
        ({"stop": ("",)}, "stop strings must be non-empty"),
    ],
)
def test_invalid_params_are_refused_with_what_is_wrong(
    kwargs: dict[str, object], says: str
) -> None:
    with pytest.raises(SamplingError) as caught:
        SamplingParams(**kwargs)  # type: ignore[arg-type]
    assert says in str(caught.value)
    assert caught.value.code is ErrorCode.BAD_REQUEST


def test_the_caps_themselves_are_accepted() -> None:
    params = SamplingParams(
        temperature=0.7,
        top_p=1.0,
        top_k=50,
        seed=2**64 - 1,
        stop_token_ids=tuple(range(MAX_STOP_TOKEN_IDS)),
        stop=("z" * MAX_STOP_CHARS,) * MAX_STOP_STRINGS,
    )
    assert not params.greedy and GREEDY.greedy


def test_stop_strings_need_a_decode() -> None:
    with pytest.raises(SamplingError, match="tokenizer"):
        TokenSampler(SamplingParams(stop=("\n",)))
    assert TokenSampler(SamplingParams(stop_token_ids=(3,))).stops_on(3)


# --- greedy and its limits -----------------------------------------------------------------


@given(TIED_LOGITS)
def test_greedy_is_exactly_argmax(logits: np.ndarray) -> None:
    sampler = TokenSampler(GREEDY)
    assert sampler.choose(logits) == int(np.argmax(logits))
    probs = next_token_probs(logits, GREEDY)
    assert probs[int(np.argmax(logits))] == 1.0 and probs.sum() == 1.0


@given(TIED_LOGITS, TEMPERATURES, st.integers(0, 2**32))
def test_top_k_one_is_greedy_whatever_the_temperature_and_seed(
    logits: np.ndarray, temperature: float, seed: int
) -> None:
    sampler = TokenSampler(SamplingParams(temperature=temperature, top_k=1, seed=seed))
    assert [sampler.choose(logits) for _ in range(3)] == [int(np.argmax(logits))] * 3


@given(TIED_LOGITS, TEMPERATURES, st.integers(0, 2**32))
def test_a_tiny_top_p_is_greedy(logits: np.ndarray, temperature: float, seed: int) -> None:
    sampler = TokenSampler(SamplingParams(temperature=temperature, top_p=1e-9, seed=seed))
    assert [sampler.choose(logits) for _ in range(3)] == [int(np.argmax(logits))] * 3


def test_a_tiny_temperature_is_greedy_on_distinct_logits() -> None:
    logits = np.array([0.1, 2.5, 2.4999, -3.0], dtype=np.float32)
    sampler = TokenSampler(SamplingParams(temperature=1e-6, seed=0))
    assert {sampler.choose(logits) for _ in range(50)} == {1}


# --- the distribution ----------------------------------------------------------------------


@settings(max_examples=200)
@given(LOGITS, TEMPERATURES, st.integers(0, 70), st.floats(0.0, 1.0))
def test_filtered_distribution_keeps_the_likeliest_and_reaches_top_p(
    logits: np.ndarray, temperature: float, top_k: int, top_p: float
) -> None:
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    probs = next_token_probs(logits, params)
    assert probs.shape == logits.shape and probs.dtype == np.float64
    assert math.isclose(probs.sum(), 1.0, rel_tol=1e-9)
    kept = probs > 0
    if top_k:
        assert kept.sum() <= top_k
    if kept.sum() < logits.size:  # nothing dropped is likelier than anything kept
        assert logits[~kept].max() <= logits[kept].min()
    if 0 < top_p < 1:
        # Before the nucleus cut: the top-k distribution; the nucleus is its smallest
        # likeliest prefix reaching top_p, so it minus its least likely token does not.
        wide = next_token_probs(logits, SamplingParams(temperature=temperature, top_k=top_k))
        assert wide[kept].sum() >= top_p - 1e-9
        assert wide[kept].sum() - wide[kept].min() < top_p + 1e-9


def test_distribution_matches_a_hand_computed_softmax() -> None:
    logits = np.array([1.0, 3.0, 2.0, 0.0], dtype=np.float32)
    t = 0.5
    soft = np.exp(logits / t, dtype=np.float64) / np.exp(logits / t, dtype=np.float64).sum()
    got = next_token_probs(logits, SamplingParams(temperature=t))
    np.testing.assert_allclose(got, soft, rtol=1e-12)
    top2 = next_token_probs(logits, SamplingParams(temperature=t, top_k=2))
    np.testing.assert_allclose(top2, [0, soft[1], soft[2], 0] / (soft[1] + soft[2]), rtol=1e-12)
    # soft = [0.0158, 0.8650, 0.1171, 0.0021]: 0.865 reaches top_p=0.8 alone, 0.9 needs two.
    np.testing.assert_allclose(
        next_token_probs(logits, SamplingParams(temperature=t, top_p=0.8)), [0, 1, 0, 0]
    )
    nucleus = next_token_probs(logits, SamplingParams(temperature=t, top_p=0.9))
    np.testing.assert_allclose(nucleus, top2, rtol=1e-12)


def test_nan_and_infinite_logits_are_handled() -> None:
    warm = SamplingParams(temperature=1.0, seed=0)
    with_nan = np.array([np.nan, 1.0, 1.0], dtype=np.float32)
    assert next_token_probs(with_nan, warm)[0] == 0.0
    infinite = np.array([0.0, np.inf, 5.0, np.inf], dtype=np.float32)
    np.testing.assert_array_equal(next_token_probs(infinite, warm), [0, 0.5, 0, 0.5])
    hopeless = np.full(4, -np.inf, dtype=np.float32)
    assert TokenSampler(warm).choose(hopeless) == 0


# --- the draw ----------------------------------------------------------------------------------


SMALL = np.array([2.0, 1.0, 0.5, 0.0, -1.0], dtype=np.float32)


def test_draws_at_temperature_one_follow_the_softmax() -> None:
    n = 20_000
    counts = draw_counts(SamplingParams(temperature=1.0, seed=11), SMALL, n)
    softmax = np.exp(SMALL) / np.exp(SMALL).sum()
    assert chi_square(counts, softmax) < CHI2_999[4]
    # The same tolerance refuses a distribution only a little off (temperature 1.25).
    off = np.exp(SMALL / 1.25) / np.exp(SMALL / 1.25).sum()
    assert chi_square(counts, off) > CHI2_999[4]


@pytest.mark.parametrize(
    ("params", "df"),
    [
        (SamplingParams(temperature=0.7, top_k=4, seed=5), 3),
        (SamplingParams(temperature=1.3, top_p=0.9, seed=6), 3),  # the least likely is cut
    ],
)
def test_filtered_draws_follow_their_distribution(params: SamplingParams, df: int) -> None:
    probs = next_token_probs(SMALL, params)
    assert (probs > 0).sum() == df + 1
    counts = draw_counts(params, SMALL, 20_000)
    assert chi_square(counts, probs) < CHI2_999[df]


def test_a_seed_gives_the_same_draws_and_other_seeds_others() -> None:
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((40, 258)).astype(np.float32)

    def run(seed: int | None) -> list[int]:
        sampler = TokenSampler(SamplingParams(temperature=1.0, top_p=0.95, seed=seed))
        return [sampler.choose(row) for row in rows]

    assert run(7) == run(7)
    assert run(7) != run(8)
    assert run(None) != run(None)  # unseeded: the OS's entropy


def test_one_draw_per_token_whatever_the_support() -> None:
    """The n-th token reads the n-th uniform of the sequence's own generator."""
    seed = 99
    reference = np.random.default_rng(seed)
    sampler = TokenSampler(SamplingParams(temperature=1.0, top_k=3, seed=seed))
    for logits in (SMALL, SMALL[::-1].copy(), np.zeros(7, np.float32), SMALL):
        u = reference.random()
        probs = next_token_probs(logits, sampler.params)
        support = np.flatnonzero(probs)
        cdf = np.cumsum(probs[support])
        expected = support[np.searchsorted(cdf, u * cdf[-1], side="right")]
        assert sampler.choose(logits) == expected


# --- stop strings ------------------------------------------------------------------------------


def test_the_earliest_stop_string_wins() -> None:
    stops = StopStrings(("END", "\n\n", "x\n"))
    found = stops.find("abcx\n\nEND")
    assert found is not None and (found.stop, found.cut) == ("x\n", 3)
    assert stops.find("nothing here\n") is None
    longest = StopStrings(("ab", "abc")).find("zabc")
    assert longest is not None and longest.stop == "abc" and longest.cut == 1


def test_safe_length_holds_back_what_may_start_a_stop_string() -> None:
    stops = StopStrings(("\n\n", "STOP"))
    assert stops.safe_length("hello") == 5
    assert stops.safe_length("hello\n") == 5
    assert stops.safe_length("hello ST") == 6
    assert stops.safe_length("hello STO") == 6
    assert stops.safe_length("hello STOP now") == 6
    assert stops.safe_length("S") == 0
    assert StopStrings(()).safe_length("anything") == 8


@settings(max_examples=300)
@given(
    st.text("abc\n", max_size=12),
    st.text("abc\n", max_size=12),
    st.lists(st.text("abc\n", min_size=1, max_size=4), min_size=1, max_size=3),
)
def test_streamed_text_never_has_to_be_taken_back(text: str, more: str, stops: list[str]) -> None:
    """Whatever comes next, the final cut is never before what was safe to emit."""
    matcher = StopStrings(tuple(stops))
    safe = matcher.safe_length(text)
    assert matcher.find(text[:safe]) is None
    final = matcher.find(text + more)
    end = final.cut if final is not None else len(text + more)
    assert end >= safe
    assert (text + more)[:safe] == text[:safe]


WORDS = ["Hel", "lo", " wor", "ld", "!", "\n", "\n"]


def word_decode(tokens: list[int] | tuple[int, ...]) -> str:
    """A word-piece tokenizer's decode (several characters per token)."""
    return "".join(WORDS[t] for t in tokens)


def test_a_stop_string_spanning_tokens_cuts_text_and_drops_tokens_wholly_after() -> None:
    tokens = [0, 1, 2, 3, 4]  # "Hello world!"
    stops = StopStrings(("o w",))  # starts inside "lo", ends inside " wor"
    cut = stops.cut(tokens, word_decode)
    assert cut is not None
    assert cut.text == "Hell"
    assert cut.tokens == 2  # "lo" straddles the cut and stays; " wor" begins after it
    on_boundary = StopStrings((" world",)).cut(tokens, word_decode)
    assert on_boundary is not None and (on_boundary.tokens, on_boundary.text) == (2, "Hello")
    at_start = StopStrings(("Hel",)).cut(tokens, word_decode)
    assert at_start is not None and (at_start.tokens, at_start.text) == (0, "")
    assert StopStrings(("xyz",)).cut(tokens, word_decode) is None


def test_tokens_before_a_cut_counts_byte_tokens_of_one_character() -> None:
    def utf8(tokens: list[int] | tuple[int, ...]) -> str:
        return bytes(tokens).decode("utf-8", errors="replace")

    tokens = [*b"ab", 0xC3, 0xA9, *b"cd"]  # "abécd": é is two byte tokens
    assert utf8(tokens) == "abécd"
    assert tokens_before(tokens, utf8, "ab") == 2  # both bytes of é are dropped
    assert tokens_before(tokens, utf8, "abé") == 4  # "ab\ufffd" (half an é) is not "abé"
    assert tokens_before(tokens, utf8, "") == 0
    stopped = StopStrings(("cd",)).cut(tokens, utf8)
    assert stopped is not None and (stopped.tokens, stopped.text) == (4, "abé")
