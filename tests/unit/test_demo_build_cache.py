"""The demo's machine-wide build cache: a build kept once is restored into a fresh clone's
store and registry (same artifacts, same digests) instead of being built again."""

from __future__ import annotations

from pathlib import Path

from graylane.app.demo.build_versions import (
    build_versions,
    drop_stale_builds,
    keep_build,
    machine_cache_folder,
    restore_build,
)
from graylane.artifacts.manifest import read_manifest
from graylane.registry.repository import open_registry
from tests.support.settings import NO_BROKER, make_settings


def test_a_kept_build_is_restored_into_a_fresh_store_and_registry(tmp_path: Path) -> None:
    first = make_settings(NO_BROKER, "first", tmp_path / "first")
    build_versions(first, "cached-gpt", {"1.0.0": 1}, size="tiny", progress=lambda _: None)
    cache = tmp_path / "cache" / "cached-gpt-1.0.0"
    registry = open_registry(first.db_url)
    keep_build(cache, registry, first.artifact_dir, "cached-gpt", "1.0.0")
    kept = {p.name for p in cache.iterdir() if p.is_dir()}
    assert kept and (cache / "build.json").is_file()

    fresh = make_settings(NO_BROKER, "fresh", tmp_path / "fresh")
    fresh_registry = open_registry(fresh.db_url)
    assert restore_build(cache, fresh_registry, fresh.artifact_dir, "cached-gpt", "1.0.0")
    before = registry.list_artifacts("cached-gpt", "1.0.0")
    after = fresh_registry.list_artifacts("cached-gpt", "1.0.0")
    assert [a.name for a in after] == [a.name for a in before]
    assert [a.manifest_sha256 for a in after] == [a.manifest_sha256 for a in before]
    for info in after:
        folder = fresh.artifact_dir / info.path
        assert folder.name in kept and read_manifest(folder).name == info.name
    source = registry.get_version("cached-gpt", "1.0.0").source_sha256
    assert fresh_registry.get_version("cached-gpt", "1.0.0").source_sha256 == source


def test_nothing_is_restored_without_a_kept_build(tmp_path: Path) -> None:
    settings = make_settings(NO_BROKER, "empty", tmp_path)
    registry = open_registry(settings.db_url)
    assert not restore_build(tmp_path / "none", registry, settings.artifact_dir, "m", "1.0.0")


def test_the_cache_is_keyed_by_the_spec() -> None:
    spec = {"model": "smollm2-onnx", "version": "1.0.0", "precisions": ["fp32"]}
    other = {**spec, "precisions": ["fp32", "int8-weight-only"]}
    assert machine_cache_folder(spec) == machine_cache_folder(dict(spec))
    assert machine_cache_folder(spec) != machine_cache_folder(other)
    assert machine_cache_folder(spec).name.startswith("smollm2-onnx-1.0.0-")


def test_keeping_a_build_drops_the_same_versions_older_keys(tmp_path: Path) -> None:
    root = tmp_path / "demo-builds"
    kept = {
        name: root / name
        for name in (
            "smollm2-onnx-1.0.0-aaaa",  # an older spec's build of the same version
            "smollm2-onnx-1.0.0-bbbb",  # the one kept now
            "smollm2-onnx-1.0.0-rc1-cccc",  # another version that shares the prefix
            "smollm2-onnx-1.1.0-dddd",  # another version
            "other-1.0.0-eeee",  # another model
        )
    }
    for folder in kept.values():
        folder.mkdir(parents=True)
        (folder / "build.json").write_text("{}", encoding="utf-8")
    partial = root / ".smollm2-onnx-1.0.0-ffff.12.partial"  # another clone's, being written
    partial.mkdir()

    dropped = drop_stale_builds(kept["smollm2-onnx-1.0.0-bbbb"])

    assert dropped == [kept["smollm2-onnx-1.0.0-aaaa"]]
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [partial.name, *(n for n in kept if n != "smollm2-onnx-1.0.0-aaaa")]
    )
