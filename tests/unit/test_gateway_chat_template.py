"""Chat templates from the model's tokenizer configuration, rendered as transformers does."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from graylane.kafka.seam import KafkaFactory
from graylane.models.hf_tokenizer import HfTokenizer
from graylane.services.gateway.catalog import ModelDirectory
from graylane.services.gateway.chat import (
    CHATML,
    ChatMessage,
    ChatRole,
    ChatTemplateError,
    ModelChatTemplate,
    load_chat_template,
)
from graylane.services.gateway.failures import ApiError
from graylane.services.gateway.logic.admission import GatewayLimits
from graylane.services.gateway.service import Gateway, GatewayConfig
from graylane.services.gateway.wire import parse_chat

FIXTURES = Path(__file__).parents[1] / "fixtures" / "llm"
EOS = "<|endoftext|>"  # the fixtures' tokenizer: id 0, their BOS and EOS

# meta-llama/Llama-2-7b-chat-hf's chat_template, as its tokenizer_config.json holds it
LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}"
    "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}"
)
CONVERSATION = [
    ChatMessage(ChatRole.SYSTEM, "You are terse."),
    ChatMessage(ChatRole.USER, "Hi"),
    ChatMessage(ChatRole.ASSISTANT, "Hello"),
    ChatMessage(ChatRole.USER, "Bye"),
]
LIMITS = GatewayLimits()


def llama_export(tmp_path: Path, template: object = LLAMA2_TEMPLATE) -> Path:
    """The llama fixture's export with a tokenizer_config.json as transformers saves it."""
    folder = tmp_path / "llama"
    shutil.copytree(FIXTURES / "llama", folder)
    config = {
        "bos_token": EOS,
        "eos_token": {"content": EOS, "lstrip": False, "normalized": False, "special": True},
        "unk_token": EOS,
        "chat_template": template,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_the_fixture_exports_have_no_template_so_chatml_applies() -> None:
    for name in ("gpt2", "llama", "gpt2-merged"):
        assert load_chat_template(FIXTURES / name) is None
    config = GatewayConfig()
    assert config.template_for("llama") is CHATML


def test_a_llama_template_renders_as_transformers_does(tmp_path: Path) -> None:
    folder = llama_export(tmp_path)
    template = load_chat_template(folder)
    assert template is not None
    prompt = template.render(CONVERSATION)
    assert prompt == (
        f"{EOS}[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi [/INST] Hello {EOS}"
        f"{EOS}[INST] Bye [/INST]"
    )
    assert template.stop == (EOS,)
    # the model's own tokenizer reads the special tokens the template wrote as its ids
    tokenizer = HfTokenizer.beside(folder / "tokenizer.json")
    ids = tokenizer.encode(prompt)
    assert ids[0] == tokenizer.eos_id == 0 and ids.count(0) == 3
    # the path of tokenizer_config.json itself works as well as its folder
    assert load_chat_template(folder / "tokenizer_config.json") == template


def test_blocks_are_trimmed_and_the_generation_prompt_is_asked_for() -> None:
    template = ModelChatTemplate(
        "{% for m in messages %}\n  {% if loop.first %}[{% endif %}\n"
        "{{ m['role'] }}: {{ m['content'] | tojson }}\n{% endfor %}\n"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )  # without trim_blocks and lstrip_blocks, newlines and indents would stay
    prompt = template.render(
        [ChatMessage(ChatRole.DEVELOPER, "é"), ChatMessage(ChatRole.USER, "x")]
    )
    assert prompt == '[system: "é"\nuser: "x"\nassistant:'


def test_generation_blocks_and_loop_controls_render_as_in_transformers() -> None:
    template = ModelChatTemplate(
        "{% for m in messages %}{% if m['role'] == 'system' %}{% continue %}{% endif %}"
        "{% if m['role'] == 'assistant' %}{% generation %}<a>{{ m['content'] }}</a>"
        "{% endgeneration %}{% else %}<u>{{ m['content'] }}</u>{% endif %}{% endfor %}"
    )
    assert template.render(CONVERSATION) == "<u>Hi</u><a>Hello</a><u>Bye</u>"


def test_named_templates_and_a_jinja_file(tmp_path: Path) -> None:
    named = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    template = load_chat_template(llama_export(tmp_path, named))
    assert template is not None and template.render(CONVERSATION) == "D"
    folder = tmp_path / "llama"
    (folder / "chat_template.jinja").write_text("{{ messages | length }}")
    template = load_chat_template(folder)
    assert template is not None and template.render(CONVERSATION) == "4"


def test_unreadable_templates_are_refused_when_read(tmp_path: Path) -> None:
    with pytest.raises(ChatTemplateError, match="not a valid Jinja2 template"):
        load_chat_template(llama_export(tmp_path / "a", "{% for m in messages %}"))
    with pytest.raises(ChatTemplateError, match="'default'"):
        load_chat_template(llama_export(tmp_path / "b", [{"name": "x", "template": "T"}]))
    broken = tmp_path / "c"
    broken.mkdir()
    (broken / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ChatTemplateError, match="cannot read"):
        load_chat_template(broken)


def _chat(template: ModelChatTemplate, *roles: str) -> ApiError:
    body = {"model": "m", "messages": [{"role": r, "content": "x"} for r in roles]}
    with pytest.raises(ApiError) as caught:
        parse_chat(body, LIMITS, template)
    return caught.value


def test_a_conversation_the_template_rejects_is_400_with_its_reason(tmp_path: Path) -> None:
    template = load_chat_template(llama_export(tmp_path))
    assert template is not None
    err = _chat(template, "user", "user")
    assert err.status == 400 and err.param == "messages"
    assert "Conversation roles must alternate" in err.message


@pytest.mark.parametrize(
    "source",
    [
        "{{ messages[3]['content'] }}",  # past the conversation's end
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",  # the sandbox refuses it
        "{{ messages.append(1) }}",  # immutable: no mutation
        "{{ 1 // 0 }}",
    ],
)
def test_a_template_failing_on_a_conversation_is_500_with_the_failure_kept_for_logs(
    source: str,
) -> None:
    """Pins the leak: the answer named the template's path and the exception's text."""
    template = ModelChatTemplate(source, origin="the test template")
    err = _chat(template, "user")
    assert err.status == 500 and err.openai_body()["error"]["code"] == "chat_template"
    assert err.message == "the model's chat template failed on this conversation"
    assert err.detail is not None
    assert err.detail.startswith("the test template failed on this conversation")


@pytest.fixture
async def http(factory: KafkaFactory, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    template = load_chat_template(llama_export(tmp_path))
    assert template is not None
    config = GatewayConfig(templates={"llama": template}, metrics_port=-1)
    gateway = Gateway(factory, config, None)

    async def topics() -> set[str]:
        return {factory.layout.ingress("llama"), factory.layout.ingress("gpt")}

    gateway.directory = ModelDirectory(factory.layout, topics)
    transport = httpx.ASGITransport(app=gateway.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        yield client


async def test_the_gateway_answers_a_rejected_conversation_and_keeps_serving(
    http: httpx.AsyncClient,
) -> None:
    two_users = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    for _ in range(2):
        answer = await http.post(
            "/v1/chat/completions", json={"model": "llama", "messages": two_users}
        )
        assert answer.status_code == 400
        assert "Conversation roles must alternate" in answer.json()["error"]["message"]
    # another model has no template of its own: ChatML does not reject the conversation,
    # so the call gets past rendering (here to the body check that follows it)
    other = await http.post(
        "/v1/chat/completions", json={"model": "gpt", "messages": two_users, "n": 9}
    )
    assert other.status_code == 400 and "n" in other.json()["error"]["message"]
    assert (await http.get("/healthz")).status_code in (200, 503)
