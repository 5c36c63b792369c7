"""Scoring one answer of an evaluation set (pure; the judge's verdict comes from outside).

Every score is in 0..1: the pass-or-fail expectations score 1 or 0 (``exact``,
``contains``, ``regex``, ``json_schema``, ``choice``, and ``reference`` with a
``min_chrf``); ``reference`` alone scores the chrF of the answer against the reference
(character n-gram F-score, sacrebleu's, divided by 100); ``judge`` scores what the judge
said (:func:`judge_verdict` reads its reply). A failed call (no answer) scores 0 and is
counted apart (:attr:`ItemScore.error`).

Text similarity is chrF because it needs no tokenizer or model, copes with inflection
and punctuation, and is a maintained metric (sacrebleu) that two versions of the same
model answering in other words still score close on.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache

import jsonschema
from sacrebleu.metrics.chrf import CHRF

from graylane.evaluation.sets import EvalItem, Expectation, ExpectationKind

__all__ = [
    "ItemScore",
    "chrf",
    "judge_prompt",
    "judge_verdict",
    "score_answer",
]

_CHOICE_RE = (
    re.compile(r"\b(?:answer|option|choice)\s*(?:is|:)?\s*\(?([A-Z])\b(?![a-z'])"),
    re.compile(r"^\W*\(?([A-Z])(?:\)|\.|:|$)"),
)
"""Where an answer names its letter: "the answer is B" (or "option (B)"), else a letter
that opens the answer as a label ("B)", "(B)", "B.", "B:", "B" alone). "A planet..." is
no choice of A."""


@dataclass(frozen=True)
class ItemScore:
    item_id: str
    score: float
    """0..1."""
    passed: bool
    detail: str = ""
    error: bool = False
    """No answer (the call failed); scores 0."""


@lru_cache(maxsize=1)
def _chrf() -> CHRF:
    return CHRF()


def chrf(answer: str, reference: str) -> float:
    """chrF of ``answer`` against ``reference``, 0..100."""
    return float(_chrf().sentence_score(answer, [reference]).score)


def _choice(answer: str) -> str:
    for pattern in _CHOICE_RE:
        found = pattern.search(answer.strip())
        if found:
            return found.group(1)
    return ""


def _norm(text: str, expect: Expectation) -> str:
    text = " ".join(text.split())
    return text if expect.case_sensitive else text.lower()


def _json(answer: str) -> object:
    text = answer.strip()
    if text.startswith("```"):  # a fenced block: the JSON inside it
        text = text.strip("`")
        text = text.split("\n", 1)[1] if text.lower().startswith("json") else text
    return json.loads(text)


def score_answer(item: EvalItem, answer: str) -> ItemScore:
    """The score of ``answer`` to ``item`` (every expectation but ``judge``)."""
    expect = item.expect
    kind = expect.kind
    if kind is ExpectationKind.EXACT:
        ok = _norm(answer, expect).strip(" .!") == _norm(expect.texts[0], expect).strip(" .!")
        return ItemScore(item.id, float(ok), ok)
    if kind is ExpectationKind.CONTAINS:
        text = _norm(answer, expect)
        missing = [t for t in expect.texts if _norm(t, expect) not in text]
        return ItemScore(item.id, float(not missing), not missing, f"missing {missing}")
    if kind is ExpectationKind.REGEX:
        flags = 0 if expect.case_sensitive else re.IGNORECASE
        ok = re.search(expect.texts[0], answer, flags) is not None
        return ItemScore(item.id, float(ok), ok)
    if kind is ExpectationKind.JSON_SCHEMA:
        try:
            value = _json(answer)
            jsonschema.validate(value, expect.schema or {})
        except (ValueError, RecursionError):
            return ItemScore(item.id, 0.0, False, "not JSON")
        except jsonschema.ValidationError as exc:
            return ItemScore(item.id, 0.0, False, f"schema: {exc.message[:80]}")
        return ItemScore(item.id, 1.0, True)
    if kind is ExpectationKind.CHOICE:
        letter = _choice(answer)
        ok = letter == expect.texts[0]
        return ItemScore(item.id, float(ok), ok, f"chose {letter or 'nothing'}")
    if kind is ExpectationKind.REFERENCE:
        value = max(chrf(answer, ref) for ref in expect.texts)
        if expect.min_chrf is not None:
            ok = value >= expect.min_chrf
            return ItemScore(item.id, float(ok), ok, f"chrF {value:.1f}")
        return ItemScore(item.id, value / 100.0, value >= 50.0, f"chrF {value:.1f}")
    raise ValueError(f"{item.id}: {kind.value} is scored by a judge (judge_verdict)")


def judge_prompt(item: EvalItem, answer: str) -> str:
    """What an LLM judge is asked about one answer (its rubric, the question, the answer)."""
    return (
        "You grade an assistant's answer. Rubric: "
        f"{item.expect.texts[0]}\n\nQuestion: {item.question}\n\nAnswer: {answer}\n\n"
        "Does the answer meet the rubric? Reply with one word: YES or NO."
    )


def judge_verdict(item: EvalItem, reply: str) -> ItemScore:
    """The score of a judge's reply to :func:`judge_prompt`: YES 1, NO 0, else 0 (noted)."""
    word = re.search(r"\b(yes|no)\b", reply, re.IGNORECASE)
    if word is None:
        return ItemScore(item.id, 0.0, False, f"judge said {reply[:40]!r}")
    ok = word.group(1).lower() == "yes"
    return ItemScore(item.id, float(ok), ok, "judge: yes" if ok else "judge: no")
