"""Chat messages and the template that turns them into one prompt (pure).

The default template is ChatML, the format many instruction-tuned models were
trained on and that a byte-level model reads as plain text::

    <|im_start|>system
    You are terse.<|im_end|>
    <|im_start|>user
    Hello<|im_end|>
    <|im_start|>assistant

Each message is ``<|im_start|>{role}\\n{content}<|im_end|>\\n``; the prompt ends with
the opening of the assistant's turn, and ``<|im_end|>`` is added to the call's stop
strings, so a model that closes its turn ends the completion there (finish reason
``stop``).

**The model's own template.** A model exported from transformers carries its chat
template in ``tokenizer_config.json`` (``chat_template``: a Jinja2 template, or a
list of named ones of which ``default`` is used) or beside it in
``chat_template.jinja``. :func:`load_chat_template` reads it as a
:class:`ModelChatTemplate`, rendered the way transformers' ``apply_chat_template``
does: a sandboxed, immutable Jinja2 environment with ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension and ``{% generation %}`` blocks, a
``tojson`` filter that keeps non-ASCII text, the globals ``raise_exception`` and
``strftime_now``, and the variables ``messages`` (``role``/``content`` mappings),
``add_generation_prompt`` (true: the prompt opens the assistant's turn) and the
configuration's special tokens (``bos_token``, ``eos_token``, ...). A template that calls
``raise_exception`` rejects the conversation (:class:`ChatTemplateError` with
``rejected``: the caller's fault); any other failure while rendering is the
template's own fault. Neither ends the gateway: the call is answered.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from functools import cached_property
from pathlib import Path
from typing import Any, NoReturn, Protocol

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from graylane.client import ToolCall
from graylane.errors import GraylaneError

__all__ = [
    "CHATML",
    "ChatFormat",
    "ChatMessage",
    "ChatRole",
    "ChatTemplate",
    "ChatTemplateError",
    "ModelChatTemplate",
    "load_chat_template",
]

TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"


class ChatRole(Enum):
    SYSTEM = "system"
    DEVELOPER = "developer"
    """OpenAI's newer name for system instructions; rendered as ``system``."""
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"
    """The result of a tool call (engine-served versions; Graylane's decoder refuses it)."""


@dataclass(frozen=True)
class ChatMessage:
    role: ChatRole
    content: str
    name: str = ""
    tool_call_id: str = ""
    """A tool message: the call it answers."""
    tool_calls: tuple[ToolCall, ...] = ()
    """An assistant message that called tools."""


class ChatFormat(Protocol):
    """What the chat endpoint needs of a template: a prompt, and where the turn ends."""

    @property
    def stop(self) -> tuple[str, ...]: ...

    def render(self, messages: Sequence[ChatMessage]) -> str: ...


def _prompt_role(role: ChatRole) -> ChatRole:
    return ChatRole.SYSTEM if role is ChatRole.DEVELOPER else role


@dataclass(frozen=True)
class ChatTemplate:
    """How messages become a prompt: a frame around each message, then the reply's opening."""

    message: str
    """Format of one message, with ``{role}`` and ``{content}``."""
    reply_opening: str
    """Appended after the last message: where the assistant's turn begins."""
    stop: tuple[str, ...]
    """Stop strings that end the assistant's turn."""

    def render(self, messages: Sequence[ChatMessage]) -> str:
        parts = []
        for m in messages:
            role = _prompt_role(m.role)
            parts.append(self.message.format(role=role.value, content=m.content))
        return "".join(parts) + self.reply_opening


CHATML = ChatTemplate(
    message="<|im_start|>{role}\n{content}<|im_end|>\n",
    reply_opening="<|im_start|>assistant\n",
    stop=("<|im_end|>",),
)
"""The default template (see the module's docstring)."""


class ChatTemplateError(GraylaneError):
    """A model's chat template cannot be read, or failed on one conversation."""

    def __init__(self, message: str, *, rejected: bool = False) -> None:
        super().__init__(message)
        self.rejected = rejected
        """The template refused the conversation itself (``raise_exception``)."""


class _Rejected(Exception):
    """Raised inside a template by ``raise_exception``."""


def _raise_exception(message: object) -> NoReturn:
    raise _Rejected(str(message))


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _GenerationBlocks(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: transformers marks the assistant's
    tokens with it (for training masks); for a prompt it renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationBlocks],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@dataclass(frozen=True)
class ModelChatTemplate:
    """A model's own Jinja2 chat template (see the module's docstring)."""

    source: str
    special_tokens: Mapping[str, str] = field(default_factory=dict)
    """``bos_token``, ``eos_token``, ... as text, passed to the template."""
    origin: str = "a chat template"
    """Where it came from, for messages."""

    def __post_init__(self) -> None:
        self._compiled  # noqa: B018 - a syntax error is found when the template is read

    @cached_property
    def _compiled(self) -> jinja2.Template:
        try:
            return _environment().from_string(self.source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(
                f"{self.origin} is not a valid Jinja2 template: {exc.message} (line {exc.lineno})"
            ) from exc

    @property
    def stop(self) -> tuple[str, ...]:
        """The end-of-sequence text: the model closes its turn with it."""
        eos = self.special_tokens.get("eos_token", "")
        return (eos,) if eos else ()

    def render(self, messages: Sequence[ChatMessage]) -> str:
        conversation = [
            {"role": _prompt_role(m.role).value, "content": m.content} for m in messages
        ]
        try:
            return self._compiled.render(
                messages=conversation, add_generation_prompt=True, **self.special_tokens
            )
        except _Rejected as exc:
            raise ChatTemplateError(str(exc), rejected=True) from exc
        except Exception as exc:  # a template can fail in any way; the call is answered
            raise ChatTemplateError(
                f"{self.origin} failed on this conversation: {type(exc).__name__}: {exc}"
            ) from exc


def _token_text(value: object) -> str | None:
    """A special token as transformers saves it: text, or an AddedToken's mapping."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _template_source(raw: object, origin: str) -> str | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list):
        named = {
            t.get("name"): t.get("template")
            for t in raw
            if isinstance(t, Mapping) and isinstance(t.get("template"), str)
        }
        chosen = named.get("default")
        if isinstance(chosen, str):
            return chosen
    raise ChatTemplateError(f"{origin}: chat_template must be a string or name a 'default' one")


def load_chat_template(path: Path) -> ModelChatTemplate | None:
    """The chat template of a model folder (or of a ``tokenizer_config.json``), if it has one.

    ``chat_template.jinja`` beside the configuration wins over its ``chat_template``.
    ChatTemplateError when the configuration or the template cannot be read.
    """
    folder = path if path.is_dir() else path.parent
    config_path = path if path.is_file() else folder / TOKENIZER_CONFIG
    config: Mapping[str, object] = {}
    if config_path.is_file():
        try:
            loaded = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ChatTemplateError(f"cannot read {config_path}: {exc}") from exc
        if not isinstance(loaded, Mapping):
            raise ChatTemplateError(f"{config_path} is not a JSON object")
        config = loaded
    jinja_file = folder / CHAT_TEMPLATE_FILE
    if jinja_file.is_file():
        source: str | None = jinja_file.read_text(encoding="utf-8")
        origin = str(jinja_file)
    else:
        origin = f"the chat_template of {config_path}"
        source = _template_source(config.get("chat_template"), origin)
    if source is None:
        return None
    tokens = {
        name: text
        for name, value in config.items()
        if name.endswith("_token") and (text := _token_text(value)) is not None
    }
    return ModelChatTemplate(source, tokens, origin)
