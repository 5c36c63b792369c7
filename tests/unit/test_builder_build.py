"""End-to-end builds of the tiny demo GPT: artifacts, manifests, caches, registry, tampering."""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from graylane.app.cli.build import EXIT_NOT_SERVABLE, EXIT_OK, register
from graylane.artifacts.build_info import Tolerance
from graylane.artifacts.fetch import FETCH_RECORD, ArtifactFetchError, FetchRecord, fetch_version
from graylane.artifacts.manifest import MANIFEST_FILE, read_manifest
from graylane.artifacts.naming import (
    ArtifactName,
    Backend,
    Precision,
    artifact_dir_name,
    parse_semver,
)
from graylane.artifacts.verify import TamperedArtifactError, manifest_sha256, verify_artifact
from graylane.builder.build import BuildReport, run_build
from graylane.builder.spec import DEFAULT_PRECISIONS, BuildSpec, load_spec
from graylane.builder.store import ArtifactExistsError, ArtifactStore
from graylane.builder.variants import VariantStatus
from graylane.engine_worker.loading import load_from_registry
from graylane.models.demo_gpt import write_demo_gpt
from graylane.registry.records import ArtifactRecord
from graylane.registry.repository import Registry, open_registry
from graylane.settings import Settings

pytestmark = pytest.mark.slow  # every test here shares one real build of the tiny GPT

SPEC = """
model: tiny-gpt
version: 1.0.0
strategy: ptq
source: tiny.onnx
profiles:
  - name: short
    shapes:
      input_ids: {min: [1, 1], opt: [4, 16], max: [8, 32]}
      attention_mask: {min: [1, 1], opt: [4, 16], max: [8, 32]}
calibration:
  {generator: demo-text, samples: 16, batch_size: 8, seq_len: 32, method: entropy, min_samples: 16}
validation:
  generator: demo-text
  samples: 16
  seed: 1
  batch_size: 8
  seq_len: 32
  generation: {prompts: 4, new_tokens: 8}
"""


class Built:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = root / "artifacts"
        self.db_url = f"sqlite:///{root / 'registry.db'}"
        write_demo_gpt(root / "tiny.onnx", "tiny", 0)
        (root / "spec.yaml").write_text(SPEC)
        self.spec = load_spec(root / "spec.yaml")
        self.registry: Registry = open_registry(self.db_url)
        self.report: BuildReport = run_build(self.spec, store=self.store, registry=self.registry)

    def folder(self, precision: Precision, report: BuildReport | None = None) -> Path:
        for v in (report or self.report).variants:
            if v.precision is precision and v.backend is Backend.ONNXRUNTIME and v.folder:
                return v.folder
        raise AssertionError(f"no {precision} artifact")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return Built(tmp_path_factory.mktemp("build"))


def test_every_variant_is_built_validated_and_servable(built: Built) -> None:
    report = built.report
    assert report.ok, report
    onnx_variants = [v for v in report.variants if v.backend is Backend.ONNXRUNTIME]
    assert [v.precision for v in onnx_variants] == list(DEFAULT_PRECISIONS)
    for v in onnx_variants:
        assert v.status is VariantStatus.PRODUCED
        assert v.servable and not v.forced
        assert v.validation is not None and v.validation.passed, v.validation
        assert str(v.artifact).startswith("tiny-gpt-onnxruntime")
        assert str(v.artifact).endswith(f"-{v.precision.value}-ptq:1.0.0")
    assert report.registered


def test_tensorrt_absence_is_reported_plainly(built: Built) -> None:
    from graylane.builder.tensorrt_build import tensorrt_unavailable_reason

    reason = tensorrt_unavailable_reason()
    expected = None if reason is None else f"TensorRT engines not built: {reason}"
    assert built.report.tensorrt_note == expected


def test_manifest_records_the_build(built: Built) -> None:
    folder = built.folder(Precision.INT8)
    manifest = verify_artifact(folder)
    assert folder.name == artifact_dir_name(manifest.name)
    assert folder.name.endswith("-int8-ptq@1.0.0")
    raw = json.loads((folder / MANIFEST_FILE).read_text())
    assert raw["name"] == str(manifest.name) and ":" in raw["name"]
    assert [f.path for f in manifest.files] == ["model.onnx"]
    assert manifest.source_onnx_sha256 == built.report.source_sha256
    assert [t.name for t in manifest.io.inputs] == ["input_ids", "attention_mask"]
    assert manifest.io.inputs[0].shape == ("batch", "seq")
    assert manifest.io.outputs[0].shape == ("batch", "seq", 258)
    assert manifest.profiles == built.spec.profiles
    assert manifest.calibration is not None
    assert manifest.calibration.samples == 16 and not manifest.calibration.cache_hit
    assert manifest.build_host.onnxruntime and manifest.build_host.cpu
    assert manifest.build_host.gpu is None or manifest.build_host.gpu.compute_capability
    assert manifest.source_git_commit is None or len(manifest.source_git_commit) == 40
    assert manifest.validation is not None and manifest.validation.metrics is not None
    assert manifest.validation.metrics.token_agreement is not None
    comparison = manifest.validation.comparison
    assert comparison is not None and comparison.engine.startswith("polygraphy ")
    assert comparison.baseline == "fp32" and comparison.iterations > 0
    assert comparison.outputs and all(o.max_abs >= 0.0 for o in comparison.outputs)
    assert manifest.servable and not manifest.forced
    assert raw["calibration"]["method"] == "entropy"


def test_int8_outside_one_percent_keeps_its_most_sensitive_nodes_in_float(built: Built) -> None:
    # Full int8 of the untrained tiny GPT agrees with fp32 on ~96 % of top-1 tokens.
    manifest = read_manifest(built.folder(Precision.INT8))
    assert manifest.validation is not None and manifest.validation.passed
    assert manifest.validation.metrics is not None
    assert manifest.validation.metrics.top1_agreement >= 0.99
    partial = manifest.partial_quantization
    assert partial is not None and partial.passed
    assert partial.full_top1_agreement is not None and partial.full_top1_agreement < 0.99
    probed = {node for group in partial.sensitivity for node in group.nodes}
    assert partial.kept_float and set(partial.kept_float) <= probed
    assert len(partial.kept_float) <= partial.node_budget < partial.quantizable_nodes
    assert partial.fp32_ms and partial.variant_ms and partial.full_ms
    assert any("kept in float" in note for note in manifest.notes)


def test_registry_holds_the_artifacts(built: Built) -> None:
    artifacts = built.registry.list_artifacts("tiny-gpt", "1.0.0")
    assert sorted(a.precision.value for a in artifacts) == sorted(
        p.value for p in DEFAULT_PRECISIONS
    )
    fp16 = built.registry.get_artifact("tiny-gpt", "1.0.0", Precision.FP16, Backend.ONNXRUNTIME)
    assert fp16.servable and fp16.validation is not None and fp16.validation.passed
    assert not Path(fp16.path).is_absolute(), "the registry stores store-relative locations"
    folder = built.store / fp16.path
    assert folder == built.folder(Precision.FP16)
    assert fp16.manifest_sha256 == manifest_sha256(folder)
    verify_artifact(folder, expected_manifest_sha256=fp16.manifest_sha256)


def test_a_worker_loads_the_store_wherever_it_is_mounted(built: Built, tmp_path: Path) -> None:
    """Copied elsewhere (an init container's emptyDir, another mount), the store serves."""
    moved = tmp_path / "mounted-elsewhere"
    shutil.copytree(built.store, moved)
    settings = replace(Settings(), db_url=built.db_url, artifact_dir=moved)
    loaded = load_from_registry(settings, "tiny-gpt", "1.0.0")
    assert set(loaded.engines) >= {"fp32", "fp16"}
    assert loaded.fp32_path is not None and loaded.fp32_path.is_relative_to(moved)


def test_a_pod_that_fetched_one_backend_skips_the_others_by_name(
    built: Built, tmp_path: Path
) -> None:
    """A CPU pod fetches no TensorRT engine (``artifacts fetch --backend onnxruntime``); its
    worker skips the engine by name, while an artifact missing for no reason is refused."""
    db = tmp_path / "registry.db"
    with (
        sqlite3.connect(built.db_url.removeprefix("sqlite:///")) as source,
        sqlite3.connect(db) as copy,
    ):
        source.backup(copy)
    db_url = f"sqlite:///{db}"
    engine_name = ArtifactName(
        "tiny-gpt", Backend.TENSORRT, "10.7.0", Precision.FP16, "ptq", parse_semver("1.0.0")
    )
    registry = open_registry(db_url)
    registry.add_artifact(  # an engine whose folder this store does not even hold
        ArtifactRecord(
            name=engine_name,
            path=artifact_dir_name(engine_name),
            manifest_sha256="0" * 64,
            servable=True,
            gpu_compute_capability="9.0",
        )
    )
    registry.engine.dispose()
    into = tmp_path / "pod"
    with pytest.raises(ArtifactFetchError, match="no such artifact folder"):
        fetch_version(db_url, "tiny-gpt", "1.0.0", store=str(built.store), into=into)
    fetched = fetch_version(
        db_url,
        "tiny-gpt",
        "1.0.0",
        store=str(built.store),
        into=into,
        backends={Backend.ONNXRUNTIME},
    )
    assert {f.name for f in fetched} == {
        str(a.name)
        for a in built.registry.list_artifacts("tiny-gpt", "1.0.0")
        if a.servable and a.backend is Backend.ONNXRUNTIME
    }
    record = FetchRecord.read(into, "tiny-gpt", "1.0.0")
    assert record is not None and set(record.left_out) == {artifact_dir_name(engine_name)}
    assert FetchRecord.read(into, "tiny-gpt", "2.0.0") is None  # another version's pod
    settings = replace(Settings(), db_url=db_url, artifact_dir=into)
    loaded = load_from_registry(settings, "tiny-gpt", "1.0.0")
    assert "fp32" in loaded.engines
    assert loaded.skipped[str(engine_name)].startswith("not fetched into this pod: a tensorrt")
    (into / FETCH_RECORD).unlink()  # the same folder, without the fetch's word for it
    with pytest.raises(TamperedArtifactError):
        load_from_registry(settings, "tiny-gpt", "1.0.0")


def test_rebuilding_a_published_version_needs_force(built: Built) -> None:
    with pytest.raises(ArtifactExistsError, match="bump the version or pass --force"):
        run_build(built.spec, store=built.store)


def test_forced_rebuild_reuses_the_calibration_cache(built: Built) -> None:
    first = read_manifest(built.folder(Precision.INT8)).calibration
    report = run_build(built.spec, store=built.store, registry=built.registry, force=True)
    second = read_manifest(built.folder(Precision.INT8, report)).calibration
    assert first is not None and second is not None
    assert second.cache_hit and second.cache_key == first.cache_key
    assert second.duration_s < first.duration_s


def test_a_variant_outside_tolerance_is_not_servable_unless_forced(built: Built) -> None:
    strict = dict(built.spec.tolerances)
    strict[Precision.INT8] = Tolerance(min_top1_agreement=1.0, max_abs=1e-6)
    spec = replace(built.spec, version=parse_semver("1.0.1"), tolerances=strict)
    report = run_build(spec, store=built.store, registry=built.registry)
    int8 = next(v for v in report.variants if v.precision is Precision.INT8)
    assert not report.ok
    assert not int8.servable and not int8.forced
    assert int8.validation is not None and int8.validation.failures
    assert not read_manifest(built.folder(Precision.INT8, report)).servable
    # Issue 33: a failed variant no longer holds back the servable ones. The version is
    # registered with them, the failed one is named, and the build still fails (exit 2).
    assert report.registered
    assert any("not registered: int8" in note for note in report.notes)
    registered = {
        a.name.precision for a in built.registry.list_artifacts("tiny-gpt", parse_semver("1.0.1"))
    }
    assert Precision.INT8 not in registered and Precision.FP32 in registered

    forced = run_build(replace(spec, version=parse_semver("1.0.2")), store=built.store, force=True)
    int8 = next(v for v in forced.variants if v.precision is Precision.INT8)
    manifest = read_manifest(built.folder(Precision.INT8, forced))
    assert int8.servable and int8.forced
    assert manifest.servable and manifest.forced
    assert manifest.validation is not None and not manifest.validation.passed


def test_tampered_artifacts_are_refused_naming_the_file(built: Built, tmp_path: Path) -> None:
    copy = tmp_path / built.folder(Precision.FP16).name
    shutil.copytree(built.folder(Precision.FP16), copy)
    verify_artifact(copy)
    model = copy / "model.onnx"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))
    with pytest.raises(TamperedArtifactError, match=r"model\.onnx") as info:
        verify_artifact(copy)
    assert info.value.file == "model.onnx"
    model.unlink()
    with pytest.raises(TamperedArtifactError, match=r"model\.onnx.*missing"):
        verify_artifact(copy)
    with pytest.raises(TamperedArtifactError, match=r"manifest\.json"):
        verify_artifact(copy, expected_manifest_sha256="0" * 64)


def test_store_lists_manifests(built: Built) -> None:
    names = {str(m.name) for _, m in ArtifactStore(built.store).manifests()}
    assert "tiny-gpt-" in next(iter(names))
    assert len(names) >= 4


def _cli(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="graylane")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_cli_build_exit_codes(
    built: Built, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    spec_path = built.root / "spec.yaml"
    args = _cli(["build", str(spec_path), "--store", str(store), "--no-registry", "--json"])
    assert args.handler(args) == EXIT_OK
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["ok"] and len(report["variants"]) >= 4

    strict = built.root / "strict.yaml"
    strict.write_text(SPEC + "tolerances:\n  fp16: {max_abs: 0.0}\n")
    args = _cli(["build", str(strict), "--store", str(tmp_path / "s2"), "--no-registry"])
    assert args.handler(args) == EXIT_NOT_SERVABLE

    args = _cli(["verify-artifact", str(next(ArtifactStore(store).folders()))])
    assert args.handler(args) == EXIT_OK


def test_spec_without_store_needs_one(built: Built) -> None:
    from graylane.builder.build import BuildError

    spec: BuildSpec = replace(built.spec, store=None)
    with pytest.raises(BuildError, match="no artifact store"):
        run_build(spec)
