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
``stop``). A template from a model's tokenizer configuration can replace it later;
:class:`ChatTemplate` is the seam.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

__all__ = ["CHATML", "ChatMessage", "ChatRole", "ChatTemplate"]


class ChatRole(Enum):
    SYSTEM = "system"
    DEVELOPER = "developer"
    """OpenAI's newer name for system instructions; rendered as ``system``."""
    USER = "user"
    ASSISTANT = "assistant"


@dataclass(frozen=True)
class ChatMessage:
    role: ChatRole
    content: str


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
            role = ChatRole.SYSTEM if m.role is ChatRole.DEVELOPER else m.role
            parts.append(self.message.format(role=role.value, content=m.content))
        return "".join(parts) + self.reply_opening


CHATML = ChatTemplate(
    message="<|im_start|>{role}\n{content}<|im_end|>\n",
    reply_opening="<|im_start|>assistant\n",
    stop=("<|im_end|>",),
)
"""The default template (see the module's docstring)."""
