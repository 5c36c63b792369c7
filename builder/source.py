"""The build's source model: where the ONNX comes from and what its header says."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from graylane.artifacts.digest import sha256_file
from graylane.artifacts.graph import io_signature, load_header, metadata_int
from graylane.artifacts.model_info import ModelInfo, read_model_info
from graylane.builder.spec import BuildSpec, DemoSource, FileSource
from graylane.builder.store import ArtifactStore, CacheKind
from graylane.builder.variants import EXTERNAL_DATA_THRESHOLD
from graylane.engine.signature import IOSignature
from graylane.errors import GraylaneError


class BuildError(GraylaneError):
    """The build cannot start or cannot finish; the message says why."""


@dataclass(frozen=True, kw_only=True)
class SourceModel:
    """The source ONNX and what the build reads from its header."""

    path: Path
    sha256: str
    signature: IOSignature
    info: ModelInfo
    max_seq_len: int | None
    pad_id: int
    external: bool
    """Its weights are (or must be) stored as external data."""


def resolve_source(spec: BuildSpec, store: ArtifactStore) -> Path:
    """The source ONNX path; the demo model is generated into the store's cache once."""
    if isinstance(spec.source, FileSource):
        if not spec.source.path.is_file():
            raise BuildError(f"source model {spec.source.path} does not exist")
        return spec.source.path
    if isinstance(spec.source, DemoSource):
        from graylane.models.demo_gpt import write_demo_gpt

        form = "-kv" if spec.source.kv_cache else ""
        target = store.cache_dir(CacheKind.SOURCES) / (
            f"demo-gpt-{spec.source.size}-seed{spec.source.seed}{form}.onnx"
        )
        if not target.is_file():
            partial = target.with_suffix(".partial")
            write_demo_gpt(
                partial, spec.source.size, spec.source.seed, kv_cache=spec.source.kv_cache
            )
            partial.replace(target)
        return target
    raise BuildError(f"unknown source {spec.source!r}")


def read_source(spec: BuildSpec, store: ArtifactStore) -> SourceModel:
    """Resolve the source, hash it and read its signature, model info and metadata."""
    source = resolve_source(spec, store)
    header = load_header(source)
    signature = io_signature(header)
    source_sha = sha256_file(source)
    max_seq_len = metadata_int(header, "max_seq_len")
    pad_id = metadata_int(header, "pad_id") or 0
    external = source.stat().st_size > EXTERNAL_DATA_THRESHOLD or any(
        init.data_location == 1 for init in header.graph.initializer
    )
    info = read_model_info(header, task=spec.task, vocab_size=spec.vocab_size)
    return SourceModel(
        path=source,
        sha256=source_sha,
        signature=signature,
        info=info,
        max_seq_len=max_seq_len,
        pad_id=pad_id,
        external=external,
    )
