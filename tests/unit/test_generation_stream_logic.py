"""The pure parts of continuous decoding: stream chunking, safe text, the cancel book."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from graylane.engine_worker.logic.streaming import StreamCursor, StreamPolicy, safe_text
from graylane.engine_worker.state import CancelBook, CancelKey
from graylane.v1 import inference_pb2


def test_the_first_token_goes_out_at_once_then_every_n_tokens_or_ms() -> None:
    cursor = StreamCursor(StreamPolicy(every_tokens=4, every_ms=100.0))
    assert not cursor.due(0, 0.0)
    assert cursor.due(1, 0.0)  # time to first token: never held back
    first = cursor.take([7], "a", 0.0)
    assert (first.sequence, first.token_ids, first.text, first.final) == (0, (7,), "a", False)
    assert not cursor.due(3, 10.0)  # 2 new tokens, 10 ms
    assert cursor.due(5, 10.0)  # 4 new tokens
    assert cursor.due(2, 100.0)  # 1 new token, 100 ms later
    assert not cursor.due(1, 500.0)  # nothing new


def test_safe_text_holds_back_a_possible_stop_string_and_a_broken_character() -> None:
    assert safe_text("hello wor", ["world"]) == "hello "
    assert safe_text("hello w", ["world"]) == "hello "
    assert safe_text("hello", ["world"]) == "hello"
    assert safe_text("caf\ufffd", []) == "caf"
    assert safe_text("ab", ["c", "bcd"]) == "a"  # "b" may begin "bcd"
    assert safe_text("abc", ["c", "bcd"]) == "a"  # "bcd", begun before "c", may still come


@given(
    st.lists(st.integers(0, 50), min_size=1, max_size=60),
    st.lists(st.integers(1, 9), min_size=1, max_size=30),
)
def test_chunks_reassemble_to_the_whole_generation(tokens: list[int], cuts: list[int]) -> None:
    text_of = "".join(chr(97 + t % 26) for t in tokens)
    cursor = StreamCursor(StreamPolicy(every_tokens=3, every_ms=1e9), stops=("zz",))
    pieces = []
    at = 0
    for cut in cuts:
        at = min(len(tokens), at + cut)
        if cursor.due(at, 0.0):
            pieces.append(cursor.take(tokens[:at], text_of[:at], 0.0))
    pieces.append(cursor.finish(tokens, text_of, 0.0))
    assert [p.sequence for p in pieces] == list(range(len(pieces)))
    assert [t for p in pieces for t in p.token_ids] == tokens
    assert "".join(p.text for p in pieces) == text_of
    assert pieces[-1].final and not any(p.final for p in pieces[:-1])


def test_request_chunking_overrides_the_workers() -> None:
    params = inference_pb2.GenerationParams(stream_every_tokens=1)
    worker = StreamPolicy(every_tokens=8, every_ms=30.0)
    mine = worker.for_request(params.stream_every_tokens, params.stream_every_ms)
    assert (mine.every_tokens, mine.every_ms) == (1, 30.0)


def test_a_cancel_is_honoured_only_for_the_reply_topic_that_asked_and_only_for_a_while() -> None:
    book = CancelBook(keep_s=10.0, capacity=2)
    book.note(CancelKey("r1", "gl.reply.a"), at_s=0.0)
    assert book.cancelled(CancelKey("r1", "gl.reply.a"), at_s=1.0)
    assert not book.cancelled(CancelKey("r1", "gl.reply.b"), at_s=1.0)  # someone else's
    assert not book.cancelled(CancelKey("r1", "gl.reply.a"), at_s=11.0)  # forgotten
    book.note(CancelKey("r2", "t"), 20.0)
    book.note(CancelKey("r3", "t"), 20.0)
    book.note(CancelKey("r4", "t"), 20.0)
    assert not book.cancelled(CancelKey("r2", "t"), 20.0)  # bounded: the oldest went
    assert book.cancelled(CancelKey("r4", "t"), 20.0)


def test_a_forged_cancel_for_another_topic_does_not_replace_a_pending_one() -> None:
    """Regression: pending cancels were kept by request id alone, so a forged cancel that
    named another reply topic replaced the requester's own, and its request then ran."""
    book = CancelBook(keep_s=10.0, capacity=8)
    book.note(CancelKey("r1", "gl.reply.gateway-a"), at_s=0.0)
    book.note(CancelKey("r1", "gl.reply.attacker"), at_s=1.0)
    assert book.cancelled(CancelKey("r1", "gl.reply.gateway-a"), at_s=2.0)
    assert book.cancelled(CancelKey("r1", "gl.reply.attacker"), at_s=2.0)  # its own only
