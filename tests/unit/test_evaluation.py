"""Evaluation sets, scoring and comparisons (pure)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graylane.evaluation.scoring import ItemScore, judge_verdict, score_answer
from graylane.evaluation.sets import EvalSetError, ExpectationKind, load_set, parse_set
from graylane.evaluation.summary import compare, summarize

SETS = Path(__file__).resolve().parents[2] / "graylane" / "evaluation" / "sets"


def _one(expect: dict[str, object], **fields: object) -> str:
    return json.dumps({"id": "q", "prompt": "Q?", "expect": expect, **fields})


def _score(expect: dict[str, object], answer: str, **fields: object) -> ItemScore:
    (item,) = parse_set(_one(expect, **fields), "t.jsonl").items
    return score_answer(item, answer)


def test_each_expectation_scores_what_it_says() -> None:
    assert _score({"exact": "Paris"}, " paris. ").passed
    assert not _score({"exact": "Paris"}, "Paris, France").passed
    assert _score({"contains": ["red", "blue"]}, "Red and BLUE").passed
    assert not _score({"contains": "Paris", "case_sensitive": True}, "paris").passed
    assert _score({"regex": r"\b7\b"}, "It is 7.").passed
    assert not _score({"regex": r"\b7\b"}, "It is 17.").passed
    schema = {"type": "object", "required": ["name"]}
    assert _score({"json_schema": schema}, '{"name": "Ann"}').passed
    assert _score({"json_schema": schema}, '```json\n{"name": "Ann"}\n```').passed
    assert not _score({"json_schema": schema}, '{"age": 3}').passed
    assert not _score({"json_schema": {}}, "not json").passed
    assert _score({"choice": "b"}, "B) Rome").passed
    assert not _score({"choice": "B"}, "Because A is right").passed
    graded = _score({"reference": "The sky is blue."}, "The sky is blue.")
    assert graded.score == pytest.approx(1.0) and graded.passed
    far = _score({"reference": "The sky is blue."}, "Bananas grow on trees.")
    assert 0.0 <= far.score < 0.4 and not far.passed
    gated = _score({"reference": "The sky is blue.", "min_chrf": 90}, "The sky is very blue.")
    assert gated.score in (0.0, 1.0)


def test_a_judge_is_read_from_its_reply() -> None:
    (item,) = parse_set(_one({"judge": "Is it polite?"}), "t.jsonl").items
    assert item.expect.kind is ExpectationKind.JUDGE
    assert judge_verdict(item, "YES.").passed
    assert not judge_verdict(item, "No, it is rude.").passed
    unclear = judge_verdict(item, "maybe")
    assert unclear.score == 0.0 and "maybe" in unclear.detail


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("{not json", "not JSON"),
        ('{"id": "q", "prompt": "x"}', "expect must be an object"),
        ('{"id": "q", "prompt": "x", "expect": {"exact": "a", "regex": "b"}}', "exactly one"),
        ('{"id": "q", "expect": {"exact": "a"}}', "either messages or prompt"),
        ('{"id": "q", "prompt": "x", "expect": {"regex": "("}}', "does not compile"),
        ('{"id": "q", "prompt": "x", "expect": {"choice": "AB"}}', "one letter"),
        ('{"id": "q", "prompt": "x", "expect": {"reference": "a", "min_chrf": 300}}', "0 to 100"),
        ('{"id": "q", "prompt": "x", "max_tokens": 0, "expect": {"exact": "a"}}', "max_tokens"),
        ('{"id": "q", "prompt": "x", "colour": 1, "expect": {"exact": "a"}}', "unknown keys"),
        ('{"id": "bad id!", "prompt": "x", "expect": {"exact": "a"}}', "id must be"),
        (
            '{"id": "q", "messages": [{"role": "robot", "content": "x"}], '
            '"expect": {"exact": "a"}}',
            "role",
        ),
    ],
)
def test_a_bad_line_is_refused_with_its_line_number(line: str, why: str) -> None:
    with pytest.raises(EvalSetError) as info:
        parse_set(f"# a comment\n\n{line}\n", "bad.jsonl")
    assert str(info.value).startswith("bad.jsonl:3: ") and why in str(info.value)


def test_ids_are_unique_and_the_digest_names_the_bytes() -> None:
    line = _one({"exact": "a"})
    with pytest.raises(EvalSetError, match="used twice"):
        parse_set(f"{line}\n{line}\n", "t.jsonl")
    a, b = parse_set(line, "a.jsonl"), parse_set(line + "\n", "a.jsonl")
    assert a.digest != b.digest and len(a.digest) == 64


def test_scores_summarize_with_an_interval_and_compare_paired() -> None:
    base = [ItemScore(f"q{i}", 1.0 if i % 10 else 0.0, bool(i % 10)) for i in range(100)]
    worse = [ItemScore(f"q{i}", 1.0 if i % 4 else 0.0, bool(i % 4)) for i in range(100)]
    s = summarize("base", base)
    assert s.mean == pytest.approx(0.9) and s.ci_low < 0.9 < s.ci_high and s.passed == 90
    same = compare("base", base, "again", base)
    assert same.difference == 0.0 and same.p_value == 1.0
    drop = compare("base", base, "worse", worse)
    assert drop.difference == pytest.approx(-0.15)
    assert drop.ci_high < 0.0 and drop.p_value < 0.01 and drop.drops_more_than(0.05)
    assert not drop.drops_more_than(0.2)
    # a comparison is on the items both answered, and reproducible
    assert compare("base", base[:50], "worse", worse).items == 50
    assert compare("base", base, "worse", worse).p_value == drop.p_value


def test_the_smollm2_set_is_valid_and_about_a_hundred_items() -> None:
    evaluation = load_set(SETS / "smollm2-basic.jsonl")
    kinds = {item.expect.kind for item in evaluation.items}
    assert 90 <= len(evaluation) <= 120
    assert {ExpectationKind.CONTAINS, ExpectationKind.REGEX, ExpectationKind.JSON_SCHEMA} <= kinds
    assert ExpectationKind.REFERENCE in kinds and ExpectationKind.CHOICE in kinds
