from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from graylane import serde
from graylane.errors import SerdeError, TensorError
from graylane.settings import SecurityProtocol, Settings, SettingsError
from graylane.topics import Cleanup, TopicKind, TopicLayout, TopicNameError
from graylane.v1 import control_pb2, dlq_pb2, inference_pb2, telemetry_pb2


def test_settings_defaults_point_at_the_local_broker() -> None:
    s = Settings.from_env({})
    assert s.bootstrap_servers == "127.0.0.1:9092"
    assert s.topic_prefix == "graylane"
    assert s.security.protocol is SecurityProtocol.PLAINTEXT


def test_the_local_broker_moved_to_another_port_is_reached_there() -> None:
    # `GRAYLANE_KAFKA_PORT=19092 make run`: the broker and every process it starts agree
    assert Settings.from_env({"GRAYLANE_KAFKA_PORT": "19092"}).bootstrap_servers == (
        "127.0.0.1:19092"
    )
    both = {"GRAYLANE_KAFKA_PORT": "19092", "GRAYLANE_BOOTSTRAP_SERVERS": "kafka:9092"}
    assert Settings.from_env(both).bootstrap_servers == "kafka:9092"  # a named one wins


def test_settings_read_every_variable() -> None:
    s = Settings.from_env(
        {
            "GRAYLANE_BOOTSTRAP_SERVERS": "kafka-1:9093,kafka-2:9093",
            "GRAYLANE_TOPIC_PREFIX": "prod",
            "GRAYLANE_SECURITY_PROTOCOL": "sasl_plaintext",
            "GRAYLANE_SASL_MECHANISM": "SCRAM-SHA-512",
            "GRAYLANE_SASL_USERNAME": "svc",
            "GRAYLANE_SASL_PASSWORD": "secret",
            "GRAYLANE_PARTITIONS": "12",
            "GRAYLANE_REPLICATION_FACTOR": "3",
            "GRAYLANE_ARTIFACT_DIR": "/srv/artifacts",
        }
    )
    assert s.bootstrap_servers == "kafka-1:9093,kafka-2:9093"
    assert s.topic_prefix == "prod"
    assert s.partitions == 12 and s.replication_factor == 3
    assert s.artifact_dir == Path("/srv/artifacts")
    options = s.security.client_options()
    assert options == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "svc",
        "sasl_plain_password": "secret",
    }
    assert "secret" not in repr(s)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"GRAYLANE_PARTITIONS": "many"}, "not an integer"),
        ({"GRAYLANE_SECURITY_PROTOCOL": "tls"}, "expected one of"),
        ({"GRAYLANE_TOPIC_PREFIX": "bad prefix"}, "may only use"),
        ({"GRAYLANE_PARTITIONS": "0"}, ">= 1"),
        ({"GRAYLANE_KAFKA_PORT": "ninety"}, "not an integer"),
    ],
)
def test_settings_reject_bad_values(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        Settings.from_env(env)


def test_sasl_needs_a_mechanism() -> None:
    s = Settings.from_env({"GRAYLANE_SECURITY_PROTOCOL": "SASL_SSL"})
    with pytest.raises(SettingsError, match="SASL_MECHANISM"):
        s.security.client_options()


def test_topic_layout_names() -> None:
    layout = TopicLayout(prefix="gl")
    assert layout.ingress("gpt") == "gl.requests.gpt"
    assert layout.version_requests("gpt", "1.2.0") == "gl.requests.gpt.1.2.0"
    assert layout.results("gpt") == "gl.results.gpt"
    assert layout.telemetry() == "gl.telemetry"
    assert layout.routing() == "gl.control.routing"
    assert layout.precision() == "gl.control.precision"
    assert layout.commands() == "gl.control.commands"
    assert layout.audit() == "gl.audit"
    assert layout.dlq() == "gl.dlq"
    assert layout.precision_key("gpt", "v2") == "gpt/v2"


@pytest.mark.parametrize("model", ["", "a.b", "has space", "x" * 101])
def test_topic_layout_rejects_bad_model_names(model: str) -> None:
    with pytest.raises(TopicNameError):
        TopicLayout().ingress(model)


def test_topic_specs_compaction_and_retention() -> None:
    layout = TopicLayout(prefix="gl", audit_retention_ms=123_000, data_retention_ms=456_000)
    specs = {s.kind: s for s in layout.shared_specs()}
    assert specs[TopicKind.ROUTING].cleanup is Cleanup.COMPACT
    assert specs[TopicKind.ROUTING].configs()["cleanup.policy"] == "compact"
    assert specs[TopicKind.PRECISION].cleanup is Cleanup.COMPACT
    assert specs[TopicKind.AUDIT].configs()["retention.ms"] == "123000"
    assert specs[TopicKind.TELEMETRY].configs()["retention.ms"] == "456000"
    model = layout.model_specs("gpt", ["v1", "v2"])
    assert {s.name for s in model} == {
        "gl.requests.gpt",
        "gl.results.gpt",
        "gl.shadow.gpt",
        "gl.requests.gpt.v1",
        "gl.requests.gpt.v2",
    }


_dtypes = st.sampled_from(["<f4", "<f2", "<f8", "<i8", "<i4", "i1", "u1", "?"])


@given(hnp.arrays(dtype=_dtypes, shape=hnp.array_shapes(min_dims=0, max_dims=4, max_side=5)))
def test_tensor_round_trip(array: np.ndarray) -> None:
    back = serde.from_tensor(serde.to_tensor("x", array))
    assert back.dtype == array.dtype
    assert back.shape == array.shape
    np.testing.assert_array_equal(back, array)


def test_tensor_byte_length_is_checked() -> None:
    t = serde.to_tensor("x", np.zeros((2, 3), np.float32))
    t.data = t.data[:-1]
    with pytest.raises(TensorError, match="do not fit shape"):
        serde.from_tensor(t)


@given(
    request_id=st.text(min_size=1, max_size=40),
    tags=st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=4),
    token_ids=st.lists(st.integers(min_value=0, max_value=257), max_size=50),
    deadline=st.integers(min_value=0, max_value=2**62),
)
def test_request_round_trip(
    request_id: str, tags: dict[str, str], token_ids: list[int], deadline: int
) -> None:
    req = inference_pb2.InferenceRequest(
        request_id=request_id,
        model="gpt",
        routing_key="user-1",
        tags=tags,
        token_ids=token_ids,
        task=inference_pb2.GENERATE,
        deadline_unix_ms=deadline,
        inputs=[serde.to_tensor("input_ids", np.array([[1, 2]], np.int64))],
    )
    data = serde.encode(req)
    assert serde.decode(inference_pb2.InferenceRequest, data) == req
    assert serde.encode(serde.decode(inference_pb2.InferenceRequest, data)) == data


def test_every_contract_round_trips() -> None:
    messages = [
        inference_pb2.InferenceResult(
            request_id="r",
            status=inference_pb2.ERROR,
            error_code=inference_pb2.BAD_SHAPE,
            error_message="x",
        ),
        telemetry_pb2.BatchTelemetry(
            model="m",
            batch_size=8,
            latency=telemetry_pb2.LatencyHistogram(
                min_ms=0.05, growth=1.05, buckets={3: 2, 90: 6}, count=8, sum_ms=12.0, max_ms=9.0
            ),
        ),
        control_pb2.RoutingTable(
            model="m",
            epoch=7,
            routes=[
                control_pb2.VersionRoute(
                    version="v2",
                    weight_percent=5.0,
                    ranges=[control_pb2.BucketRange(start=0, end=500)],
                )
            ],
        ),
        control_pb2.PrecisionCommand(model="m", version="v1", variant="int8", epoch=3),
        dlq_pb2.DeadLetter(original_value=b"\xff\x00", source_topic="t", source_offset=9),
    ]
    for m in messages:
        assert serde.decode(type(m), serde.encode(m)) == m


@pytest.mark.parametrize("data", [b"\xff\xff\xff\xff", b"\x0a\x05ab", None])
def test_decode_errors_are_typed(data: bytes | None) -> None:
    with pytest.raises(SerdeError):
        serde.decode(inference_pb2.InferenceRequest, data)


def test_secrets_come_from_mounted_files(tmp_path: Path) -> None:
    """Regression: SASL passwords and database URLs could only be environment variables,
    which every child process, /proc/<pid>/environ and the pod spec show."""
    (tmp_path / "password").write_text("s3cret\n")
    (tmp_path / "url").write_text("postgresql+psycopg://reader:pw@db/graylane")
    (tmp_path / "username").write_text("worker\n")
    settings = Settings.from_env(
        {
            "GRAYLANE_SASL_PASSWORD_FILE": str(tmp_path / "password"),
            "GRAYLANE_SASL_USERNAME_FILE": str(tmp_path / "username"),
            "GRAYLANE_DB_URL_FILE": str(tmp_path / "url"),
        }
    )
    assert settings.security.sasl_password == "s3cret"
    assert settings.security.sasl_username == "worker"
    assert settings.db_url == "postgresql+psycopg://reader:pw@db/graylane"


def test_a_secret_file_that_cannot_be_read_or_doubles_a_variable_is_refused(
    tmp_path: Path,
) -> None:
    with pytest.raises(SettingsError, match=r"GRAYLANE_DB_URL_FILE=.*cannot read it"):
        Settings.from_env({"GRAYLANE_DB_URL_FILE": str(tmp_path / "missing")})
    (tmp_path / "password").write_text("from-file")
    both = {
        "GRAYLANE_SASL_PASSWORD": "from-env",
        "GRAYLANE_SASL_PASSWORD_FILE": str(tmp_path / "password"),
    }
    with pytest.raises(SettingsError, match="both set") as raised:
        Settings.from_env(both)
    assert "from-file" not in str(raised.value) and "from-env" not in str(raised.value)
