"""Build the demo's model versions through the builder into the registry (once)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

from graylane.artifacts.manifest import read_manifest
from graylane.artifacts.naming import parse_semver
from graylane.builder.build import register_build, run_build
from graylane.builder.spec import parse_spec
from graylane.registry.records import ModelNotRegistered, UnknownVersion
from graylane.registry.repository import Registry, open_registry
from graylane.settings import Settings

__all__ = [
    "SMOLLM2_SPEC",
    "build_smollm2_onnx",
    "build_versions",
    "keep_build",
    "machine_cache_folder",
    "restore_build",
]


def build_versions(
    settings: Settings,
    model: str,
    seeds: Mapping[str, int],
    *,
    size: str,
    precisions: tuple[str, ...] = ("fp32", "int8-dynamic"),
    progress: Callable[[str], None] = print,
    kv_cache: bool = False,
) -> None:
    """Build each version unless the registry already has its artifacts.

    ``kv_cache``: the demo GPT's decoder-with-past export (a generative model served
    by continuous batching)."""
    registry = open_registry(settings.db_url)
    for version, seed in seeds.items():
        try:
            if registry.list_artifacts(model, version):
                progress(f"    {model} {version}: already built")
                continue
        except (ModelNotRegistered, UnknownVersion):
            pass
        spec = parse_spec(
            {
                "model": model,
                "version": version,
                "strategy": "demo",
                "source": {"demo": size, "seed": seed, "kv_cache": kv_cache},
                "precisions": list(precisions),
                # Synthetic demo text, kept small so the demo starts fast; real builds
                # calibrate on >= 500 captured requests (graylane calib capture).
                "calibration": {
                    "generator": "demo-text",
                    "samples": 16,
                    "seq_len": 32,
                    "min_samples": 16,
                },
                # The demo's QoS ladder steps down to int8 knowingly under load, so it
                # accepts the degraded rungs of an untrained model (top-1 ~0.96-0.98);
                # real builds keep the 1 % default and partial quantization.
                "tolerances": {
                    "int8": {"min_top1_agreement": 0.95},
                    "int8-dynamic": {"min_top1_agreement": 0.95},
                },
                "validation": {
                    "generator": "demo-text",
                    "samples": 8,
                    "seed": 1,
                    "seq_len": 32,
                    "generation": {"prompts": 2, "new_tokens": 4},
                },
            },
            Path.cwd(),
        )
        report = run_build(
            spec, store=settings.artifact_dir, registry=registry, signing_key=settings.signing_key
        )
        servable = [v for v in report.variants if v.servable]
        progress(
            f"    {model} {version}: built {len(servable)} servable variant(s) "
            f"in {report.duration_s:.1f}s"
        )


SMOLLM2_SPEC = Path(__file__).resolve().parents[2] / "builder" / "examples" / "smollm2-gguf.yaml"
"""The builder's SmolLM2 example: the GGUF imported into ONNX, with weight-only rungs."""


def build_smollm2_onnx(
    settings: Settings,
    model: str,
    version: str,
    precisions: tuple[str, ...],
    *,
    gguf: Path,
    progress: Callable[[str], None] = print,
) -> None:
    """SmolLM2-135M-Instruct imported from ``gguf`` into ONNX by the builder, with the
    weight-only ``precisions`` of :data:`SMOLLM2_SPEC`, registered as ``model``/``version``;
    skipped when the registry already has its artifacts (the import itself is cached in
    the artifact store's source cache: a rebuild does not convert again)."""
    import yaml
    from rich.console import Console

    from graylane.builder.progress import RichProgress

    registry = open_registry(settings.db_url)
    data = yaml.safe_load(SMOLLM2_SPEC.read_text(encoding="utf-8"))
    data.update(
        model=model,
        version=version,
        precisions=list(precisions),
        source={"gguf": str(gguf)},
    )
    # a rung outside its tolerance is searched briefly here, not for the example's 15 min
    data["partial_quantization"] = {**data.get("partial_quantization", {}), "max_trials": 2}
    cached = machine_cache_folder(data)
    try:
        if registry.list_artifacts(model, version):
            progress(f"    {model} {version}: already built")
            if settings.signing_key is None:
                keep_build(cached, registry, settings.artifact_dir, model, version)
            return
    except (ModelNotRegistered, UnknownVersion):
        pass
    if restore_build(cached, registry, settings.artifact_dir, model, version):
        progress(f"    {model} {version}: built before on this machine, restored from {cached}")
        return
    spec = parse_spec(data, SMOLLM2_SPEC.parent)
    report = run_build(
        spec,
        RichProgress(Console()),
        store=settings.artifact_dir,
        registry=registry,
        signing_key=settings.signing_key,
    )
    servable = [v.precision.value for v in report.variants if v.servable]
    progress(f"    {model} {version}: built {', '.join(servable)} in {report.duration_s:.1f}s")
    if settings.signing_key is None:  # a signed build stays with its key's store
        keep_build(cached, registry, settings.artifact_dir, model, version)


# -- the machine's cache of the demo's SmolLM2 build (shared by every clone) -----------------


def machine_cache_folder(spec: Mapping[str, object]) -> Path:
    """Where this machine keeps the build of ``spec`` (a decoded spec): under
    ``${GRAYLANE_CACHE_DIR:-~/.cache/graylane}/demo-builds``, keyed by the spec's text and
    ONNX Runtime's version, so a fresh clone restores it instead of building again."""
    import onnxruntime

    from graylane.deploy.engines.layout import cache_root

    text = json.dumps({"spec": spec, "onnxruntime": onnxruntime.__version__}, sort_keys=True)
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    return cache_root() / "demo-builds" / f"{spec['model']}-{spec['version']}-{key}"


_CACHE_RECORD = "build.json"


def keep_build(cache: Path, registry: Registry, store: Path, model: str, version: str) -> None:
    """Copy the registered artifacts of ``model``/``version`` into ``cache`` (written
    aside, renamed into place); a cache already there is kept."""
    if (cache / _CACHE_RECORD).is_file():
        return
    partial = cache.with_name(f".{cache.name}.{os.getpid()}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for info in registry.list_artifacts(model, version):
        folder = Path(info.path) if Path(info.path).is_absolute() else store / info.path
        shutil.copytree(folder, partial / folder.name, copy_function=_link_or_copy)
    record = {"source_sha256": registry.get_version(model, version).source_sha256}
    (partial / _CACHE_RECORD).write_text(json.dumps(record), encoding="utf-8")
    try:
        partial.rename(cache)
    except OSError:  # another clone kept it meanwhile
        shutil.rmtree(partial, ignore_errors=True)
    drop_stale_builds(cache)


def drop_stale_builds(cache: Path) -> list[Path]:
    """Remove the machine's kept builds of the same model and version under other keys
    (an older spec or ONNX Runtime): one is kept per model version, so a machine's cache
    does not grow by a build (about 800 MB for SmolLM2) each time the spec changes."""
    stem = cache.name.rsplit("-", 1)[0]  # <model>-<version>, the key cut off
    stale = [
        p
        for p in cache.parent.glob(f"{stem}-*")
        if p != cache and p.name.rsplit("-", 1)[0] == stem and (p / _CACHE_RECORD).is_file()
    ]
    for folder in stale:
        shutil.rmtree(folder, ignore_errors=True)
    return stale


def restore_build(cache: Path, registry: Registry, store: Path, model: str, version: str) -> bool:
    """Register the artifacts kept in ``cache`` (copied into ``store``, their manifests'
    sha256 checked by every worker that loads them); False when there is none."""
    record = cache / _CACHE_RECORD
    if not record.is_file():
        return False
    published = []
    for folder in sorted(p for p in cache.iterdir() if p.is_dir()):
        dest = store / folder.name
        if not dest.exists():
            shutil.copytree(folder, dest, copy_function=_link_or_copy)
        published.append((read_manifest(dest), dest))
    source = json.loads(record.read_text(encoding="utf-8"))["source_sha256"]
    register_build(
        registry, model, parse_semver(version), source, published, replace=False, store=store
    )
    return bool(published)


def _link_or_copy(src: str, dst: str) -> None:
    """A hard link where both sides share a file system (artifacts are never written to
    after publishing), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
