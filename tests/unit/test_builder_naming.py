"""Artifact names and semantic versions."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from graylane.artifacts.naming import (
    ArtifactName,
    Backend,
    NamingError,
    Precision,
    SemVer,
    artifact_dir_name,
    parse_artifact_name,
    parse_semver,
)

_word = st.from_regex(r"[a-z0-9]{1,6}", fullmatch=True)
models = st.lists(_word, min_size=1, max_size=4).flatmap(
    lambda words: st.lists(
        st.sampled_from(["-", "_"]), min_size=len(words) - 1, max_size=len(words) - 1
    ).map(lambda seps: "".join(w + s for w, s in zip(words, [*seps, ""], strict=True)))
)
strategies_ = st.lists(_word, min_size=1, max_size=3).map("_".join)
idents = st.one_of(
    st.integers(min_value=0, max_value=999).map(str),
    st.from_regex(r"[a-z][a-z0-9-]{0,5}", fullmatch=True),
)
semvers = st.builds(
    SemVer,
    major=st.integers(0, 50),
    minor=st.integers(0, 50),
    patch=st.integers(0, 50),
    prerelease=st.lists(idents, max_size=3).map(tuple),
    build=st.lists(st.from_regex(r"[0-9A-Za-z-]{1,5}", fullmatch=True), max_size=2).map(tuple),
)
names = st.builds(
    ArtifactName,
    model=models,
    backend=st.sampled_from(list(Backend)),
    backend_version=st.lists(st.integers(0, 200).map(str), min_size=1, max_size=4).map(".".join),
    precision=st.sampled_from(list(Precision)),
    strategy=strategies_,
    version=semvers,
)


@given(names)
def test_format_parse_round_trip(name: ArtifactName) -> None:
    assert parse_artifact_name(str(name)) == name


@given(semvers)
def test_semver_round_trip(version: SemVer) -> None:
    assert parse_semver(str(version)) == version


def test_examples_parse() -> None:
    name = parse_artifact_name("demo-gpt-onnxruntime1.32.0-int8-ptq:1.0.0")
    assert name == ArtifactName(
        "demo-gpt", Backend.ONNXRUNTIME, "1.32.0", Precision.INT8, "ptq", SemVer(1, 0, 0)
    )
    trt = parse_artifact_name("demo-gpt-tensorrt10.13.0-fp16-default:1.2.0")
    assert (trt.backend, trt.backend_version, trt.precision) == (
        Backend.TENSORRT,
        "10.13.0",
        Precision.FP16,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "smollm2-llamacpp0.3.36-q4_1-gguf:1.0.0",
            ArtifactName(
                "smollm2", Backend.LLAMACPP, "0.3.36", Precision.Q4_1, "gguf", SemVer(1, 0, 0)
            ),
        ),
        (
            "m-trtllm1.0.0-fp8-default:2.0.0",
            ArtifactName("m", Backend.TRTLLM, "1.0.0", Precision.FP8, "default", SemVer(2, 0, 0)),
        ),
        (
            "qwen-2-vllm0.11.0-bf16-default:1.0.0-rc.1",
            ArtifactName(
                "qwen-2",
                Backend.VLLM,
                "0.11.0",
                Precision.BF16,
                "default",
                parse_semver("1.0.0-rc.1"),
            ),
        ),
        (
            "m-sglang0.5.2-int4-awq:1.0.0",
            ArtifactName("m", Backend.SGLANG, "0.5.2", Precision.INT4, "awq", SemVer(1, 0, 0)),
        ),
    ],
)
def test_engine_server_names_round_trip(text: str, expected: ArtifactName) -> None:
    assert parse_artifact_name(text) == expected
    assert str(expected) == text


def test_gguf_k_quants_are_not_read_as_a_shorter_type_with_a_strategy() -> None:
    for precision in (Precision.Q4_K_M, Precision.Q5_K_S, Precision.Q3_K_L, Precision.Q2_K):
        name = parse_artifact_name(f"m-llamacpp0.3.36-{precision.value}-gguf:1.0.0")
        assert (name.precision, name.strategy) == (precision, "gguf")


def test_only_the_in_process_runtimes_are_not_engine_servers() -> None:
    local = {b for b in Backend if not b.is_engine_server}
    assert local == {Backend.ONNXRUNTIME, Backend.TENSORRT}


def test_int8_dynamic_is_not_read_as_int8_with_a_strategy() -> None:
    name = parse_artifact_name("m-onnxruntime1.32.0-int8-dynamic-default:0.1.0")
    assert name.precision is Precision.INT8_DYNAMIC
    assert name.strategy == "default"


def test_model_that_looks_like_a_backend_parses_from_the_right() -> None:
    name = parse_artifact_name("my-tensorrt1-net-onnxruntime1.2-fp32-default:1.0.0")
    assert name.model == "my-tensorrt1-net"
    assert name.backend is Backend.ONNXRUNTIME


@pytest.mark.parametrize(
    "text",
    [
        "demo-gpt-onnxruntime1.32.0-int8-ptq",  # no version
        "demo-gpt-cuda12-int8-ptq:1.0.0",  # unknown backend
        "demo-gpt-onnxruntime1.32.0-int3-ptq:1.0.0",  # unknown precision
        "smollm2-llamacpp0.3.36-q4_1:1.0.0",  # no strategy
        "smollm2-llamacppb4567-q4_1-gguf:1.0.0",  # an engine's version is numbers
        "demo-gpt-onnxruntime1.32.0-int8-ptq:1.0",  # not semver
        "Demo-onnxruntime1.32.0-int8-ptq:1.0.0",  # uppercase model
        "demo.gpt-onnxruntime1.32.0-int8-ptq:1.0.0",  # a dot in the model: no topics for it
        "demo-onnxruntime-int8-ptq:1.0.0",  # backend without version
    ],
)
def test_bad_names_are_refused(text: str) -> None:
    with pytest.raises(NamingError):
        parse_artifact_name(text)


@pytest.mark.parametrize("text", ["1", "1.0", "01.0.0", "v1.0.0", "1.0.0-", "1.0.0-01", "1.0.0+"])
def test_bad_semver_is_refused(text: str) -> None:
    with pytest.raises(NamingError, match="semantic version"):
        parse_semver(text)


def test_semver_precedence_follows_the_spec() -> None:
    ordered = [
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
        "1.0.1",
        "1.2.0",
        "2.0.0",
    ]
    versions = [parse_semver(v) for v in ordered]
    assert sorted(reversed(versions)) == versions
    assert all(a < b for a, b in itertools.pairwise(versions))


def test_build_metadata_does_not_change_precedence() -> None:
    a, b = parse_semver("1.0.0+a"), parse_semver("1.0.0+b")
    assert not a < b and not b < a
    assert a.same_precedence(b)
    assert a != b


def test_folder_name_is_filesystem_safe() -> None:
    name = parse_artifact_name("demo-gpt-tensorrt10.13.0-fp16-default:1.2.0")
    assert artifact_dir_name(name) == "demo-gpt-tensorrt10.13.0-fp16-default@1.2.0"
    assert artifact_dir_name(name, "8.6").endswith("~sm86")
    assert ":" not in artifact_dir_name(name)


def test_strategy_with_dash_is_refused() -> None:
    with pytest.raises(NamingError, match="strategy"):
        ArtifactName("m", Backend.ONNXRUNTIME, "1.0", Precision.FP32, "my-ptq", SemVer(1, 0, 0))
