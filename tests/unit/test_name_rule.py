"""One rule for model and version names: what the registry accepts has topics, and back."""

from __future__ import annotations

from pathlib import Path

import pytest

from graylane.registry.records import RegistryError
from graylane.registry.repository import Registry, open_registry
from graylane.topics import TopicLayout, TopicNameError

MODELS = [
    "gpt",
    "demo-gpt",
    "demo_gpt",
    "a1-b2_c3",
    "x" * 100,
    "demo.gpt",  # topics split <p>.requests.<model>.<version> on dots
    "Demo",
    "has space",
    "",
    "-gpt",
    "gpt-",
    "demo--gpt",
    "x" * 101,
    "gpt+1",
]
VERSIONS = ["1.0.0", "1.2.3-rc.1", "0.0.1-alpha-2", "1.0.0+build.5", "1.0", "v1.0.0", ""]


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    return open_registry(f"sqlite:///{tmp_path / 'registry.db'}")


def _registers(registry: Registry, model: str) -> bool:
    try:
        registry.register_model(model)
    except RegistryError:
        return False
    return True


def _has_topics(model: str, version: str = "1.0.0") -> bool:
    try:
        TopicLayout().ingress(model)
        TopicLayout().version_requests(model, version)
    except TopicNameError:
        return False
    return True


@pytest.mark.parametrize("model", MODELS)
def test_registry_and_topics_agree_on_model_names(registry: Registry, model: str) -> None:
    assert _registers(registry, model) == _has_topics(model)


def test_the_set_holds_both_answers(registry: Registry) -> None:
    answers = {_registers(registry, m) for m in MODELS}
    assert answers == {True, False}
    assert not _registers(registry, "demo.gpt")


@pytest.mark.parametrize("version", VERSIONS)
def test_every_registrable_version_has_its_topic(registry: Registry, version: str) -> None:
    registry.register_model("gpt")
    try:
        info = registry.register_version("gpt", version, "0" * 64)
    except RegistryError:
        return
    topic = TopicLayout(prefix="p").version_requests("gpt", str(info.version))
    assert topic == f"p.requests.gpt.{version}"
    assert topic.split(".", 3)[2] == "gpt"


def test_a_version_with_build_metadata_is_refused(registry: Registry) -> None:
    registry.register_model("gpt")
    with pytest.raises(RegistryError, match="build metadata"):
        registry.register_version("gpt", "1.0.0+build.5", "0" * 64)
    with pytest.raises(TopicNameError):
        TopicLayout().version_requests("gpt", "1.0.0+build.5")
