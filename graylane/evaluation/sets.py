"""Evaluation sets: prompts with what their answers must meet, read from JSONL.

One JSON object a line::

    {"id": "capital-fr", "messages": [{"role": "user", "content": "Capital of France?"}],
     "expect": {"contains": "Paris"}}
    {"id": "sum", "prompt": "2 + 2 =", "max_tokens": 4, "expect": {"regex": "\\\\b4\\\\b"}}

- the question: ``messages`` (a chat, OpenAI's roles) or ``prompt`` (text);
- ``max_tokens`` (default 48) and ``response_format`` (``json_object``: the call asks
  for JSON, for engines that constrain their output);
- ``expect``, one of:

  - ``exact``: the answer, stripped, equals it (``case_sensitive``: false by default);
  - ``contains``: the answer contains it (a string, or a list: all of them);
  - ``regex``: the answer matches it (``re.search``);
  - ``json_schema``: the answer is JSON valid against the schema (``{}``: any JSON);
  - ``choice``: a multiple-choice letter: the answer's first letter A-Z standing alone;
  - ``reference``: a reference answer, scored by character n-gram F-score (chrF, 0..1)
    against it; with ``min_chrf`` (0..100) the item passes or fails at that score;
  - ``judge``: a rubric an LLM judge reads with the question and the answer.

Blank lines and lines starting with ``#`` are skipped. Every problem is an
:class:`EvalSetError` naming the file, the line and what to fix. A set's
:attr:`EvalSet.digest` names exactly what was asked (it goes on record with its scores).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from graylane.errors import GraylaneError

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "ChatTurn",
    "EvalItem",
    "EvalSet",
    "EvalSetError",
    "Expectation",
    "ExpectationKind",
    "load_set",
    "parse_set",
]

DEFAULT_MAX_TOKENS = 48
MAX_ITEMS = 100_000
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_ROLES = frozenset({"system", "developer", "user", "assistant"})


class EvalSetError(GraylaneError, ValueError):
    """An evaluation set cannot be read as written."""


class ExpectationKind(Enum):
    EXACT = "exact"
    CONTAINS = "contains"
    REGEX = "regex"
    JSON_SCHEMA = "json_schema"
    CHOICE = "choice"
    REFERENCE = "reference"
    JUDGE = "judge"

    @property
    def graded(self) -> bool:
        """Scored on a scale (0..1), not pass or fail."""
        return self in (ExpectationKind.REFERENCE, ExpectationKind.JUDGE)


@dataclass(frozen=True)
class Expectation:
    kind: ExpectationKind
    texts: tuple[str, ...] = ()
    """exact / contains / reference / choice / judge: the text(s); regex: the pattern."""
    schema: Mapping[str, Any] | None = None
    """json_schema: the schema."""
    case_sensitive: bool = False
    min_chrf: float | None = None
    """reference: the chrF (0..100) at which the item passes; None: scored by chrF."""


@dataclass(frozen=True)
class ChatTurn:
    role: str
    content: str


@dataclass(frozen=True)
class EvalItem:
    id: str
    expect: Expectation
    messages: tuple[ChatTurn, ...] = ()
    prompt: str = ""
    max_tokens: int = DEFAULT_MAX_TOKENS
    json_mode: bool = False
    """Ask the engine for a JSON object (``response_format: json_object``)."""

    @property
    def question(self) -> str:
        """The question in words (the last user turn, or the prompt)."""
        users = [t.content for t in self.messages if t.role == "user"]
        return users[-1] if users else self.prompt


@dataclass(frozen=True)
class EvalSet:
    name: str
    items: tuple[EvalItem, ...]
    digest: str
    """sha256 of the set's bytes."""

    def __len__(self) -> int:
        return len(self.items)


def _fail(where: str, message: str) -> EvalSetError:
    return EvalSetError(f"{where}: {message}")


def _texts(raw: object, where: str, name: str) -> tuple[str, ...]:
    if isinstance(raw, str) and raw:
        return (raw,)
    if isinstance(raw, list) and raw and all(isinstance(x, str) and x for x in raw):
        return tuple(raw)
    raise _fail(where, f"expect.{name} must be a non-empty string or list of strings")


def _expectation(raw: object, where: str) -> Expectation:
    if not isinstance(raw, Mapping):
        raise _fail(where, "expect must be an object naming one expectation")
    kinds = [k for k in raw if k in {e.value for e in ExpectationKind}]
    if len(kinds) != 1:
        names = ", ".join(e.value for e in ExpectationKind)
        raise _fail(where, f"expect must name exactly one of {names}; got {sorted(raw)}")
    kind = ExpectationKind(kinds[0])
    value = raw[kinds[0]]
    known = {kinds[0], "case_sensitive", "min_chrf"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise _fail(where, f"expect has unknown keys {unknown}")
    case = raw.get("case_sensitive", False)
    if not isinstance(case, bool):
        raise _fail(where, "expect.case_sensitive must be true or false")
    if kind is ExpectationKind.JSON_SCHEMA:
        if not isinstance(value, Mapping):
            raise _fail(where, "expect.json_schema must be a JSON schema object ({} for any JSON)")
        return Expectation(kind, schema=dict(value))
    if kind is ExpectationKind.REGEX:
        (pattern,) = _texts(value, where, "regex")[:1]
        try:
            re.compile(pattern)
        except re.error as exc:
            raise _fail(where, f"expect.regex does not compile: {exc}") from None
        return Expectation(kind, (pattern,), case_sensitive=case)
    if kind is ExpectationKind.CHOICE:
        letter = value if isinstance(value, str) else ""
        if not re.fullmatch(r"[A-Za-z]", letter):
            raise _fail(where, "expect.choice must be one letter, e.g. 'B'")
        return Expectation(kind, (letter.upper(),))
    texts = _texts(value, where, kind.value)
    min_chrf = raw.get("min_chrf")
    if min_chrf is not None:
        if kind is not ExpectationKind.REFERENCE:
            raise _fail(where, "min_chrf goes with expect.reference only")
        if isinstance(min_chrf, bool) or not isinstance(min_chrf, int | float):
            raise _fail(where, "expect.min_chrf must be a number from 0 to 100")
        if not 0 <= min_chrf <= 100:
            raise _fail(where, "expect.min_chrf must be a number from 0 to 100")
    if kind in (ExpectationKind.EXACT, ExpectationKind.JUDGE) and len(texts) != 1:
        raise _fail(where, f"expect.{kind.value} takes one string")
    return Expectation(
        kind,
        texts,
        case_sensitive=case,
        min_chrf=float(min_chrf) if min_chrf is not None else None,
    )


def _messages(raw: object, where: str) -> tuple[ChatTurn, ...]:
    if not isinstance(raw, list) or not raw:
        raise _fail(where, "messages must be a non-empty list of {role, content}")
    turns = []
    for i, m in enumerate(raw):
        if (
            not isinstance(m, Mapping)
            or m.get("role") not in _ROLES
            or not isinstance(m.get("content"), str)
        ):
            raise _fail(
                where,
                f"messages[{i}] must be {{'role': one of {sorted(_ROLES)}, 'content': text}}",
            )
        turns.append(ChatTurn(str(m["role"]), str(m["content"])))
    return tuple(turns)


_ITEM_KEYS = frozenset({"id", "messages", "prompt", "max_tokens", "response_format", "expect"})


def _item(raw: object, where: str) -> EvalItem:
    if not isinstance(raw, Mapping):
        raise _fail(where, "each line must be a JSON object")
    unknown = sorted(set(raw) - _ITEM_KEYS)
    if unknown:
        raise _fail(where, f"unknown keys {unknown} (known: {sorted(_ITEM_KEYS)})")
    item_id = raw.get("id")
    if not isinstance(item_id, str) or not _ID_RE.fullmatch(item_id):
        raise _fail(where, "id must be 1-128 letters, digits, '.', '_', ':' or '-'")
    if ("messages" in raw) == ("prompt" in raw):
        raise _fail(where, "give either messages or prompt")
    messages = _messages(raw["messages"], where) if "messages" in raw else ()
    prompt = raw.get("prompt", "")
    if "prompt" in raw and (not isinstance(prompt, str) or not prompt):
        raise _fail(where, "prompt must be non-empty text")
    max_tokens = raw.get("max_tokens", DEFAULT_MAX_TOKENS)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not max_tokens >= 1:
        raise _fail(where, "max_tokens must be a positive integer")
    fmt = raw.get("response_format")
    if fmt not in (None, "text", "json_object"):
        raise _fail(where, "response_format must be 'text' or 'json_object'")
    return EvalItem(
        id=item_id,
        expect=_expectation(raw.get("expect"), where),
        messages=messages,
        prompt=str(prompt),
        max_tokens=max_tokens,
        json_mode=fmt == "json_object",
    )


def parse_set(text: str, name: str) -> EvalSet:
    """The set a JSONL text holds (``name`` names it in errors and reports)."""
    items: list[EvalItem] = []
    seen: set[str] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        where = f"{name}:{number}"
        try:
            raw = json.loads(stripped)
        except (ValueError, RecursionError) as exc:
            raise _fail(where, f"not JSON: {exc}") from None
        item = _item(raw, where)
        if item.id in seen:
            raise _fail(where, f"id {item.id!r} is used twice")
        seen.add(item.id)
        items.append(item)
        if len(items) > MAX_ITEMS:
            raise _fail(where, f"more than {MAX_ITEMS} items")
    if not items:
        raise EvalSetError(f"{name}: no items")
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return EvalSet(name, tuple(items), digest)


def load_set(path: Path) -> EvalSet:
    """The evaluation set in ``path`` (JSONL, UTF-8)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EvalSetError(f"{path}: cannot be read: {exc}") from None
    return parse_set(text, path.name)
