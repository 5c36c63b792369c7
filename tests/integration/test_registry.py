"""Model registry on SQLite and on a real PostgreSQL server, schema made by Alembic."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect
from sqlalchemy.exc import DBAPIError

from graylane.artifacts.naming import ArtifactName, Backend, Precision, SemVer, parse_semver
from graylane.engine_worker.loading import NoServableVariant, load_from_registry
from graylane.registry.migrate import SchemaNotCurrent, downgrade, upgrade
from graylane.registry.records import (
    ArtifactRecord,
    DuplicateArtifact,
    DuplicateVersion,
    EndpointSummary,
    ModelNotRegistered,
    RegistryError,
    RungQuality,
    UnknownArtifact,
    UnknownVersion,
    ValidationSummary,
    VersionStatus,
)
from graylane.registry.repository import Registry, open_registry
from graylane.settings import Settings

TABLES = {
    "registry_models",
    "registry_model_versions",
    "registry_artifacts",
    "registry_validation_results",
    "registry_stable_versions",
    "registry_stable_revisions",
    "registry_rung_quality",
    "registry_alembic_version",
    "cp_route_configs",
}


@pytest.fixture(scope="session")
def pg_url() -> str:
    """URL of the local PostgreSQL test server, started when it is not running."""
    from graylane.deploy.postgres import layout as postgres_layout
    from graylane.deploy.postgres import server as postgres_server

    postgres_server.start()
    return postgres_layout.url()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'registry.db'}"
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture
def registry(db_url: str) -> Iterator[Registry]:
    reg = open_registry(db_url)
    yield reg
    reg.engine.dispose()


@pytest.fixture
def model() -> str:
    """A model name no other test (or earlier run on the shared server) uses."""
    return f"reg-test-{uuid.uuid4().hex[:12]}"


def _record(
    model: str,
    version: str = "1.0.0",
    precision: Precision = Precision.FP16,
    backend: Backend = Backend.ONNXRUNTIME,
    cc: str | None = None,
    servable: bool = True,
    path: str = "/artifacts/x",
) -> ArtifactRecord:
    name = ArtifactName(
        model,
        backend,
        "10.13.0" if backend is Backend.TENSORRT else "1.32.0",
        precision,
        "ptq",
        parse_semver(version),
    )
    return ArtifactRecord(
        name=name,
        path=path,
        manifest_sha256="f" * 64,
        servable=servable,
        gpu_compute_capability=cc,
        validation=ValidationSummary(
            passed=servable,
            max_abs=0.01,
            mean_rel=0.001,
            cosine=0.9999,
            top1_agreement=0.99,
            token_agreement=0.95,
            rows=128,
            failures=() if servable else ("cosine 0.9 < 0.99", "top1_agreement 0.5 < 0.9"),
        ),
    )


def test_migrations_create_every_table_and_are_idempotent(db_url: str) -> None:
    upgrade(db_url)
    upgrade(db_url)
    engine = create_engine(db_url)
    try:
        assert set(inspect(engine).get_table_names()) >= TABLES
    finally:
        engine.dispose()


def test_downgrade_and_upgrade_again(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'down.db'}"
    upgrade(url)
    downgrade(url)
    engine = create_engine(url)
    try:
        assert not (TABLES - {"registry_alembic_version"}) & set(inspect(engine).get_table_names())
        upgrade(url)
        assert set(inspect(engine).get_table_names()) >= TABLES
    finally:
        engine.dispose()


def test_models_and_versions(registry: Registry, model: str) -> None:
    info = registry.register_model(model, "a test model")
    assert registry.register_model(model) == info  # idempotent
    assert registry.get_model(model).description == "a test model"
    assert model in [m.name for m in registry.list_models()]

    for text in ("1.10.0", "1.2.0", "1.2.0-rc.1", "0.9.0"):
        registry.register_version(model, text, "a" * 64)
    assert [str(v.version) for v in registry.list_versions(model)] == [
        "0.9.0",
        "1.2.0-rc.1",
        "1.2.0",
        "1.10.0",
    ]
    version = registry.get_version(model, SemVer(1, 2, 0))
    assert version.status is VersionStatus.REGISTERED and version.source_sha256 == "a" * 64
    assert version.created_at.tzinfo is not None
    built = registry.set_version_status(model, "1.2.0", VersionStatus.BUILT)
    assert built.status is VersionStatus.BUILT


def test_typed_errors(registry: Registry, model: str) -> None:
    with pytest.raises(ModelNotRegistered):
        registry.register_version(model, "1.0.0", "a" * 64)
    with pytest.raises(ModelNotRegistered):
        registry.list_versions(model)
    registry.register_model(model)
    registry.register_version(model, "1.0.0", "a" * 64)
    with pytest.raises(DuplicateVersion, match="bump the version"):
        registry.register_version(model, "1.0.0", "b" * 64)
    with pytest.raises(UnknownVersion):
        registry.get_version(model, "2.0.0")
    with pytest.raises(UnknownVersion):
        registry.add_artifact(_record(model, "2.0.0"))
    with pytest.raises(RegistryError, match="semantic version"):
        registry.get_version(model, "2.0")
    with pytest.raises(RegistryError, match="model name"):
        registry.register_model("Not Valid")


def test_artifacts(registry: Registry, model: str) -> None:
    registry.register_model(model)
    registry.register_version(model, "1.0.0", "a" * 64)
    fp16 = registry.add_artifact(_record(model))
    registry.add_artifact(_record(model, precision=Precision.INT8, servable=False))
    assert fp16.servable and fp16.target == "any"
    with pytest.raises(DuplicateArtifact, match="--force"):
        registry.add_artifact(_record(model))
    replaced = registry.add_artifact(_record(model, path="/artifacts/new"), replace=True)
    assert replaced.path == "/artifacts/new"

    listed = registry.list_artifacts(model, "1.0.0")
    assert sorted(a.precision.value for a in listed) == ["fp16", "int8"]
    int8 = registry.get_artifact(model, "1.0.0", Precision.INT8, Backend.ONNXRUNTIME)
    assert not int8.servable
    assert int8.validation is not None and not int8.validation.passed
    assert int8.validation.failures == ("cosine 0.9 < 0.99", "top1_agreement 0.5 < 0.9")
    with pytest.raises(UnknownArtifact):
        registry.get_artifact(model, "1.0.0", Precision.FP32, Backend.ONNXRUNTIME)

    # Results are frozen dataclasses, not ORM rows.
    assert dataclasses.is_dataclass(int8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        int8.servable = True  # type: ignore[misc]


def test_engines_for_several_gpus(registry: Registry, model: str) -> None:
    registry.register_model(model)
    registry.register_version(model, "1.0.0", "a" * 64)
    for cc in ("8.6", "9.0"):
        registry.add_artifact(
            _record(model, backend=Backend.TENSORRT, cc=cc, path=f"/artifacts/sm{cc}")
        )
    hopper = registry.get_artifact(
        model, "1.0.0", Precision.FP16, Backend.TENSORRT, compute_capability="9.0"
    )
    assert hopper.target == "sm90" and hopper.gpu_compute_capability == "9.0"
    assert hopper.path == "/artifacts/sm9.0"
    with pytest.raises(UnknownArtifact, match=r"compute capability 7\.5"):
        registry.get_artifact(
            model, "1.0.0", Precision.FP16, Backend.TENSORRT, compute_capability="7.5"
        )


def test_engine_endpoints_round_trip_in_ladder_order(registry: Registry, model: str) -> None:
    registry.register_model(model)
    registry.register_version(model, "1.0.0", "c" * 64)
    registry.add_artifact(_record(model, precision=Precision.FP32))  # an ONNX file beside them
    ladder = [(Precision.Q8_0, "b" * 64), (Precision.Q4_1, None), (Precision.Q2_K, "d" * 64)]
    for rank, (precision, digest) in reversed(list(enumerate(ladder))):  # registered worst first
        name = ArtifactName(
            model, Backend.LLAMACPP, "0.3.36", precision, "gguf", parse_semver("1.0.0")
        )
        registry.add_artifact(
            ArtifactRecord(
                name=name,
                path=f"{model}/{precision.value}",
                manifest_sha256="e" * 64,
                servable=True,
                endpoint=EndpointSummary(f"http://10.0.0.{rank}:8081", digest, rank),
            )
        )
    listed = registry.list_artifacts(model, "1.0.0")
    assert [a.precision for a in listed] == [
        Precision.FP32,
        Precision.Q8_0,
        Precision.Q4_1,
        Precision.Q2_K,
    ]
    assert listed[0].endpoint is None
    assert [a.endpoint for a in listed[1:]] == [
        EndpointSummary("http://10.0.0.0:8081", "b" * 64, 0),
        EndpointSummary("http://10.0.0.1:8081", None, 1),
        EndpointSummary("http://10.0.0.2:8081", "d" * 64, 2),
    ]
    q2 = registry.get_artifact(model, "1.0.0", Precision.Q2_K, Backend.LLAMACPP)
    assert (q2.name.backend_version, q2.target) == ("0.3.36", "any")


def _quality(precision: Precision, score: float, sha: str = "a" * 64) -> RungQuality:
    return RungQuality(
        precision=precision, set_name="smollm2-basic", set_sha256=sha, items=40, score=score,
        ci_low=score - 0.1, ci_high=score + 0.1, reference_precision=Precision.F16,
        reference_score=0.619,
    )  # fmt: skip


def test_rung_quality_is_stored_per_rung_and_set_and_the_newest_wins(
    registry: Registry, model: str
) -> None:
    registry.register_model(model)
    registry.register_version(model, "1.0.0", "c" * 64)
    stored = registry.record_rung_quality(
        model, "1.0.0", [_quality(Precision.F16, 0.619), _quality(Precision.Q4_0, 0.475)]
    )
    assert [r.precision for r in stored] == [Precision.F16, Precision.Q4_0]
    assert all(r.recorded_at is not None for r in stored)
    got = registry.rung_quality(model, "1.0.0")
    assert set(got) == {Precision.F16, Precision.Q4_0}
    assert got[Precision.Q4_0].quality_drop == pytest.approx(0.144)
    assert got[Precision.F16].quality_drop == 0.0
    # the same rung on the same set again replaces it; on another set it is newer
    registry.record_rung_quality(model, "1.0.0", [_quality(Precision.Q4_0, 0.5)])
    assert registry.rung_quality(model, "1.0.0")[Precision.Q4_0].score == 0.5
    registry.record_rung_quality(model, "1.0.0", [_quality(Precision.Q4_0, 0.45, "b" * 64)])
    newest = registry.rung_quality(model, "1.0.0")[Precision.Q4_0]
    assert (newest.score, newest.set_sha256) == (0.45, "b" * 64)
    with pytest.raises(UnknownVersion):
        registry.record_rung_quality(model, "9.9.9", [_quality(Precision.Q4_0, 0.5)])
    assert registry.rung_quality(model, "1.0.0")[Precision.F16].score == 0.619


def test_the_endpoint_columns_migrate_down_and_up(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'endpoints.db'}"
    upgrade(url)
    columns = {"endpoint_url", "model_sha256", "ladder_rank"}
    engine = create_engine(url)
    try:
        found = {c["name"] for c in inspect(engine).get_columns("registry_artifacts")}
        assert columns <= found
        downgrade(url, "0003")
        found = {c["name"] for c in inspect(engine).get_columns("registry_artifacts")}
        assert not columns & found and "gpu_compute_capability" in found
        upgrade(url)
        found = {c["name"] for c in inspect(engine).get_columns("registry_artifacts")}
        assert columns <= found
    finally:
        engine.dispose()


def test_stable_version(registry: Registry, model: str) -> None:
    registry.register_model(model)
    assert registry.get_stable(model) is None
    registry.register_version(model, "1.0.0", "a" * 64)
    registry.register_version(model, "1.1.0", "b" * 64)
    registry.set_stable(model, "1.0.0")
    stable = registry.get_stable(model)
    assert stable is not None and stable.version == SemVer(1, 0, 0)
    registry.set_stable(model, parse_semver("1.1.0"))
    assert registry.get_model(model).stable_version == SemVer(1, 1, 0)
    with pytest.raises(UnknownVersion):
        registry.set_stable(model, "9.9.9")
    with pytest.raises(ModelNotRegistered):
        registry.get_stable(model + "-missing")


def test_previous_stable_is_recorded_for_revert(registry: Registry, model: str) -> None:
    registry.register_model(model)
    for v in ("1.0.0", "1.1.0", "1.2.0"):
        registry.register_version(model, v, "a" * 64)
    registry.set_stable(model, "1.0.0")
    assert registry.get_previous_stable(model) is None  # the first stable has none
    registry.set_stable(model, "1.1.0")  # e.g. a promotion
    previous = registry.get_previous_stable(model)
    assert previous is not None and previous.version == SemVer(1, 0, 0)
    registry.set_stable(model, "1.1.0")  # setting it again keeps the previous one
    previous = registry.get_previous_stable(model)
    assert previous is not None and previous.version == SemVer(1, 0, 0)
    registry.set_stable(model, "1.0.0")  # a revert: the promoted one becomes previous
    previous = registry.get_previous_stable(model)
    assert previous is not None and previous.version == SemVer(1, 1, 0)


def test_a_read_only_registry_never_migrates(tmp_path: Path) -> None:
    """Regression: every worker ran the Alembic migrations when it opened the registry."""
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    with pytest.raises(SchemaNotCurrent, match="start the control plane first"):
        open_registry(url, read_only=True)
    engine = create_engine(url)
    try:
        assert inspect(engine).get_table_names() == []  # nothing was created
    finally:
        engine.dispose()
    upgrade(url)
    open_registry(url, read_only=True).engine.dispose()  # once migrated, it opens


def test_a_read_only_registry_reads_and_refuses_every_write(
    registry: Registry, db_url: str, model: str
) -> None:
    """Regression: workers held full-write database access to the registry."""
    registry.register_model(model, "written by the control plane")
    registry.register_version(model, "1.0.0", "a" * 64)
    registry.add_artifact(_record(model))
    reader = open_registry(db_url, read_only=True)
    try:
        assert reader.get_model(model).name == model
        assert [a.name for a in reader.list_artifacts(model, "1.0.0")] == [_record(model).name]
        writes = {
            "register a model": lambda: reader.register_model(f"{model}-x"),
            "register a version": lambda: reader.register_version(model, "2.0.0", "b" * 64),
            "add an artifact": lambda: reader.add_artifact(_record(model, "1.0.0", Precision.INT8)),
            "set the stable version": lambda: reader.set_stable(model, "1.0.0"),
        }
        for what, write in writes.items():
            try:
                write()
            except DBAPIError:
                continue
            raise AssertionError(f"a read-only registry let a worker {what}")
    finally:
        reader.engine.dispose()
    assert [m.name for m in registry.list_models() if m.name.startswith(model)] == [model]
    assert [str(v.version) for v in registry.list_versions(model)] == ["1.0.0"]
    assert len(registry.list_artifacts(model, "1.0.0")) == 1
    assert registry.get_stable(model) is None


def test_a_worker_loading_from_the_registry_neither_migrates_nor_writes(tmp_path: Path) -> None:
    """Regression: every worker ran the Alembic migrations at start (with write access)."""
    url = f"sqlite:///{tmp_path / 'worker.db'}"
    settings = Settings(db_url=url, artifact_dir=tmp_path / "artifacts")
    with pytest.raises(SchemaNotCurrent):
        load_from_registry(settings, "gpt", "1.0.0")
    engine = create_engine(url)
    try:
        assert inspect(engine).get_table_names() == []
    finally:
        engine.dispose()
    upgrade(url)
    writer = open_registry(url)
    writer.register_model("gpt")
    writer.register_version("gpt", "1.0.0", "a" * 64)
    writer.engine.dispose()
    with pytest.raises(NoServableVariant):  # it read the (empty) registry, no more
        load_from_registry(settings, "gpt", "1.0.0")
