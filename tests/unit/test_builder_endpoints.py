"""A version engine servers serve: registered from an ``engine:`` spec (no ONNX file, no
server needed), shown by ``graylane model show``, loaded back by the worker in ladder
order, verified like any artifact, fetched as manifests alone; and the build's probe."""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from graylane.app.cli import models
from graylane.app.cli.build import EXIT_NOT_SERVABLE, EXIT_OK
from graylane.app.cli.build import register as register_build_cli
from graylane.app.cli.main import build_parser
from graylane.artifacts.fetch import ArtifactFetchError, fetch_version
from graylane.artifacts.manifest import MANIFEST_FILE, manifest_from_dict, manifest_to_dict
from graylane.artifacts.model_info import ModelTask
from graylane.artifacts.naming import Backend, Precision
from graylane.artifacts.signing import (
    SIGNATURE_FILE,
    KeyPair,
    SignatureFailure,
    generate_key_pair,
)
from graylane.artifacts.verify import TamperedArtifactError, verify_artifact
from graylane.builder.build import BuildError, BuildReport, run_build
from graylane.builder.endpoints import (
    EndpointProbeError,
    model_digests,
    probe_endpoint,
    version_digest,
)
from graylane.builder.spec import EngineSpec, SpecError, load_spec, parse_spec
from graylane.builder.store import ArtifactExistsError
from graylane.builder.variants import VariantStatus
from graylane.engine.server import EngineEndpoint
from graylane.engine_worker.loading import NoServableVariant, load_from_registry
from graylane.registry.records import VersionStatus
from graylane.registry.repository import Registry, open_registry
from graylane.settings import Settings

MODEL = "smollm2"

SPEC = """
model: smollm2
version: 1.0.0
engine:
  backend: llamacpp
  version: "0.3.36"
  variants:                 # best first: the QoS ladder
    - precision: q4_1
      url: {q4_url}
      model_file: models/SmolLM2-135M-Instruct.Q4_1.gguf
      served_model: {q4_served}
      slots: 4
    - precision: q2_k
      url: {q2_url}
      model_file: models/SmolLM2-135M-Instruct.Q2_K.gguf
      served_model: {q2_served}
      slots: 2
"""

Q4_URL, Q2_URL = "http://127.0.0.1:8081", "http://127.0.0.1:8082"


@dataclass
class Setup:
    root: Path
    store: Path
    db_url: str
    spec_path: Path
    q4_sha: str
    q2_sha: str

    def spec(self) -> EngineSpec:
        spec = load_spec(self.spec_path)
        assert isinstance(spec, EngineSpec)
        return spec

    def registry(self) -> Registry:
        return open_registry(self.db_url)

    def build(self, **options: Any) -> BuildReport:
        registry = self.registry()
        try:
            return run_build(self.spec(), store=self.store, registry=registry, **options)
        finally:
            registry.engine.dispose()

    def settings(self, **overrides: Any) -> Settings:
        return replace(Settings(), db_url=self.db_url, artifact_dir=self.store, **overrides)

    def folder(self, report: BuildReport, precision: Precision) -> Path:
        folder = next(v.folder for v in report.variants if v.precision is precision)
        assert folder is not None
        return folder


def _setup(
    root: Path,
    q4_url: str = Q4_URL,
    q2_url: str = Q2_URL,
    q4_served: str = "",
    q2_served: str = "",
) -> Setup:
    models = root / "models"
    models.mkdir(parents=True)
    q4, q2 = b"GGUF q4_1 weights" * 1000, b"GGUF q2_k weights" * 500
    (models / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(q4)
    (models / "SmolLM2-135M-Instruct.Q2_K.gguf").write_bytes(q2)
    spec_path = root / "smollm2.yaml"
    spec_path.write_text(
        SPEC.format(
            q4_url=q4_url,
            q2_url=q2_url,
            q4_served=json.dumps(q4_served),
            q2_served=json.dumps(q2_served),
        )
    )
    return Setup(
        root=root,
        store=root / "artifacts",
        db_url=f"sqlite:///{root / 'registry.db'}",
        spec_path=spec_path,
        q4_sha=hashlib.sha256(q4).hexdigest(),
        q2_sha=hashlib.sha256(q2).hexdigest(),
    )


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    return _setup(tmp_path)


@pytest.fixture
def built(setup: Setup) -> tuple[Setup, BuildReport]:
    return setup, setup.build()


# -- the build: one manifest per endpoint, registered -----------------------------------------


def test_an_engine_spec_registers_one_manifest_per_endpoint(
    built: tuple[Setup, BuildReport],
) -> None:
    setup, report = built
    assert report.ok and report.registered
    assert report.source is None  # no ONNX file
    assert report.source_sha256 == setup.q4_sha  # the first variant's model digest
    assert [(v.precision, v.backend, v.status) for v in report.variants] == [
        (Precision.Q4_1, Backend.LLAMACPP, VariantStatus.PRODUCED),
        (Precision.Q2_K, Backend.LLAMACPP, VariantStatus.PRODUCED),
    ]
    assert [str(v.artifact) for v in report.variants] == [
        "smollm2-llamacpp0.3.36-q4_1-gguf:1.0.0",
        "smollm2-llamacpp0.3.36-q2_k-gguf:1.0.0",
    ]
    folder = setup.folder(report, Precision.Q2_K)
    # The model file stays where the engine loads it: the artifact is its manifest.
    assert sorted(p.name for p in folder.iterdir()) == [MANIFEST_FILE]
    manifest = verify_artifact(folder)
    assert manifest.files == () and manifest.servable
    assert manifest.model_info is not None and manifest.model_info.task is ModelTask.CAUSAL_LM
    endpoint = manifest.endpoint
    assert endpoint is not None
    assert (endpoint.url, endpoint.model_sha256, endpoint.slots) == (Q2_URL, setup.q2_sha, 2)
    assert (endpoint.rung, endpoint.ladder) == (1, ("q4_1", "q2_k"))
    assert endpoint.model_file == "SmolLM2-135M-Instruct.Q2_K.gguf"
    assert endpoint.probe is None  # not asked for
    assert manifest.source_onnx_sha256 == setup.q4_sha
    assert manifest.engine_endpoint() == EngineEndpoint(
        variant="q2_k",
        url=Q2_URL,
        backend=Backend.LLAMACPP,
        engine_version="0.3.36",
        model_sha256=setup.q2_sha,
        slots=2,
    )


def test_the_registry_records_each_endpoint_in_ladder_order(
    built: tuple[Setup, BuildReport],
) -> None:
    setup, _ = built
    registry = setup.registry()
    try:
        version = registry.get_version(MODEL, "1.0.0")
        artifacts = registry.list_artifacts(MODEL, "1.0.0")
    finally:
        registry.engine.dispose()
    assert version.status is VersionStatus.BUILT and version.source_sha256 == setup.q4_sha
    # Ladder order, although q2_k sorts first by name.
    assert [a.precision for a in artifacts] == [Precision.Q4_1, Precision.Q2_K]
    q4, q2 = artifacts
    assert (q4.backend, q4.name.backend_version, q4.servable) == (Backend.LLAMACPP, "0.3.36", True)
    assert q4.endpoint is not None and q2.endpoint is not None
    assert (q4.endpoint.url, q4.endpoint.model_sha256, q4.endpoint.ladder_rank) == (
        Q4_URL,
        setup.q4_sha,
        0,
    )
    assert (q2.endpoint.url, q2.endpoint.ladder_rank) == (Q2_URL, 1)
    assert not Path(q2.path).is_absolute() and (setup.store / q2.path).is_dir()


def test_model_show_gives_backend_endpoint_engine_version_and_model_digest(
    built: tuple[Setup, BuildReport],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from graylane.services.controlplane.wire import model_summary, version_summary
    from graylane.v1 import controlplane_pb2

    setup, _ = built
    registry = setup.registry()
    try:
        answer = controlplane_pb2.ListVersionsResponse(
            model=model_summary(registry.get_model(MODEL)),
            versions=[version_summary(registry, MODEL, "1.0.0")],
        )
    finally:
        registry.engine.dispose()
    variant = answer.versions[0].variants[0]
    assert (variant.backend, variant.backend_version) == ("llamacpp", "0.3.36")
    assert (variant.endpoint.url, variant.endpoint.model_sha256) == (Q4_URL, setup.q4_sha)
    monkeypatch.setattr(models, "call", lambda *a, **k: answer)
    monkeypatch.setenv("COLUMNS", "400")
    args = build_parser().parse_args(["model", "show", MODEL])
    assert args.handler(args) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "smollm2-llamacpp" in line]
    assert len(lines) == 2
    for line, url, digest in ((lines[0], Q4_URL, setup.q4_sha), (lines[1], Q2_URL, setup.q2_sha)):
        assert "llamacpp 0.3.36" in line and url in line
        assert digest[:12] in line and digest[12:] not in line  # short


def test_a_rebuild_needs_force_and_a_changed_source_a_new_version(setup: Setup) -> None:
    setup.build()
    with pytest.raises(ArtifactExistsError, match="bump the version or pass --force"):
        setup.build()
    assert setup.build(force=True).registered


def test_model_files_are_hashed_and_checked_against_a_stated_digest(setup: Setup) -> None:
    spec = setup.spec()
    assert model_digests(spec) == {Precision.Q4_1: setup.q4_sha, Precision.Q2_K: setup.q2_sha}
    first = spec.engine.variants[0]
    pinned = replace(first, model_sha256="0" * 64)
    wrong = replace(spec, engine=replace(spec.engine, variants=(pinned,)))
    with pytest.raises(BuildError, match=r"engine.variants\[0\]: .*model_sha256 is 0000"):
        model_digests(wrong)
    gone = replace(first, model_file=setup.root / "nowhere.gguf")
    with pytest.raises(BuildError, match=r"engine.variants\[0\].model_file: .* does not exist"):
        model_digests(replace(spec, engine=replace(spec.engine, variants=(gone,))))


def test_without_model_digests_the_version_digest_is_the_spec_statement() -> None:
    def spec(url: str) -> EngineSpec:
        raw = {
            "model": "m",
            "version": "2.0.0",
            "engine": {
                "backend": "trtllm",
                "version": "1.0.0",
                "variants": [
                    {"precision": "fp16", "url": f"{url}:8000"},
                    {"precision": "fp8", "url": f"{url}:8001"},
                ],
            },
        }
        parsed = parse_spec(raw, base_dir=Path("/"))
        assert isinstance(parsed, EngineSpec)
        return parsed

    a, b = spec("http://a"), spec("http://b")
    digests = model_digests(a)
    assert digests == {Precision.FP16: "", Precision.FP8: ""}
    assert version_digest(a, digests) == version_digest(spec("http://a"), digests)
    assert version_digest(a, digests) != version_digest(b, digests)
    assert len(version_digest(a, digests)) == 64


def test_a_version_without_onnx_registers_with_stated_digests(tmp_path: Path) -> None:
    digest = "ab" * 32
    raw = {
        "model": "m",
        "version": "2.0.0",
        "engine": {
            "backend": "vllm",
            "version": "0.11.0",
            "variants": [
                {"precision": "bf16", "url": "http://gpu-0:8000", "model_sha256": digest},
                {"precision": "fp8", "url": "http://gpu-1:8000", "served_model": "m-fp8"},
            ],
        },
    }
    spec = parse_spec(raw, base_dir=tmp_path)
    registry = open_registry(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        report = run_build(spec, store=tmp_path / "store", registry=registry)
        assert report.ok and report.registered and report.source_sha256 == digest
        bf16, fp8 = registry.list_artifacts("m", "2.0.0")
    finally:
        registry.engine.dispose()
    assert str(bf16.name) == "m-vllm0.11.0-bf16-default:2.0.0"
    assert bf16.endpoint is not None and bf16.endpoint.model_sha256 == digest
    assert fp8.endpoint is not None and fp8.endpoint.model_sha256 is None  # not known


# -- loading for the worker ----------------------------------------------------------------------


def test_the_worker_loads_the_endpoints_in_ladder_order(
    built: tuple[Setup, BuildReport],
) -> None:
    setup, _ = built
    loaded = load_from_registry(setup.settings(), MODEL, "1.0.0")
    assert loaded.engines == {} and loaded.fp32_path is None and loaded.tokenizer is None
    assert [e.variant for e in loaded.endpoints] == ["q4_1", "q2_k"]
    q4 = loaded.endpoints[0]
    assert q4 == EngineEndpoint(
        variant="q4_1",
        url=Q4_URL,
        backend=Backend.LLAMACPP,
        engine_version="0.3.36",
        model_sha256=setup.q4_sha,
        slots=4,
    )
    assert loaded.model_info is not None and loaded.model_info.generates
    assert not loaded.refused and not loaded.skipped


def test_a_tampered_endpoint_manifest_is_refused_naming_it(
    built: tuple[Setup, BuildReport],
) -> None:
    setup, report = built
    manifest = setup.folder(report, Precision.Q2_K) / MANIFEST_FILE
    raw = json.loads(manifest.read_text())
    raw["endpoint"]["url"] = "http://attacker.example:8082"
    manifest.write_text(json.dumps(raw, indent=2) + "\n")
    with pytest.raises(TamperedArtifactError, match=r"manifest\.json: sha256 .* registered"):
        load_from_registry(setup.settings(), MODEL, "1.0.0")


def test_a_manifest_must_agree_with_its_backend_about_an_endpoint(
    built: tuple[Setup, BuildReport],
) -> None:
    setup, report = built
    folder = setup.folder(report, Precision.Q4_1)
    raw = json.loads((folder / MANIFEST_FILE).read_text())
    assert manifest_to_dict(manifest_from_dict(raw)) == raw  # the layout round-trips
    (folder / MANIFEST_FILE).write_text(json.dumps({**raw, "endpoint": None}))
    with pytest.raises(TamperedArtifactError, match="a llamacpp artifact names no endpoint"):
        verify_artifact(folder)
    onnx = {**raw, "name": raw["name"].replace("llamacpp0.3.36-q4_1", "onnxruntime1.22.0-fp32")}
    (folder / MANIFEST_FILE).write_text(json.dumps(onnx))
    with pytest.raises(TamperedArtifactError, match="cannot name an engine endpoint"):
        verify_artifact(folder)


@pytest.fixture
def keys(tmp_path: Path) -> KeyPair:
    return generate_key_pair(tmp_path / "keys" / "builder.pem")


def test_signed_endpoints_verify_and_an_altered_one_is_refused_like_any_artifact(
    setup: Setup, keys: KeyPair
) -> None:
    report = setup.build(signing_key=keys.private_key)
    q2 = setup.folder(report, Precision.Q2_K)
    assert (q2 / SIGNATURE_FILE).is_file()
    trusted = setup.settings(trusted_keys=(keys.public_key,))
    assert [e.variant for e in load_from_registry(trusted, MODEL, "1.0.0").endpoints] == [
        "q4_1",
        "q2_k",
    ]
    (q2 / "extra.json").write_text("{}")  # added after signing; the manifest is untouched
    loaded = load_from_registry(trusted, MODEL, "1.0.0")
    assert [e.variant for e in loaded.endpoints] == ["q4_1"]
    (refused,) = loaded.refused
    assert refused.artifact == "smollm2-llamacpp0.3.36-q2_k-gguf:1.0.0"
    assert refused.reason is SignatureFailure.TAMPERED


def test_unsigned_endpoints_are_refused_where_keys_are_trusted(
    built: tuple[Setup, BuildReport], keys: KeyPair
) -> None:
    setup, _ = built
    with pytest.raises(NoServableVariant, match="unsigned"):
        load_from_registry(setup.settings(trusted_keys=(keys.public_key,)), MODEL, "1.0.0")


# -- fetching: nothing but the manifest --------------------------------------------------------


def test_fetch_copies_an_endpoint_manifest_and_the_worker_loads_from_it(
    built: tuple[Setup, BuildReport], tmp_path: Path
) -> None:
    setup, _ = built
    into = tmp_path / "pod"
    fetched = fetch_version(setup.db_url, MODEL, "1.0.0", store=str(setup.store), into=into)
    assert [(f.files, f.endpoint) for f in fetched] == [(1, Q4_URL), (1, Q2_URL)]
    loaded = load_from_registry(replace(setup.settings(), artifact_dir=into), MODEL, "1.0.0")
    assert [e.url for e in loaded.endpoints] == [Q4_URL, Q2_URL]
    llamacpp = fetch_version(
        setup.db_url,
        MODEL,
        "1.0.0",
        store=str(setup.store),
        into=tmp_path / "llamacpp-pod",
        backends={Backend.LLAMACPP},
    )
    assert len(llamacpp) == 2
    with pytest.raises(ArtifactFetchError, match="no servable artifact for onnxruntime"):
        fetch_version(
            setup.db_url,
            MODEL,
            "1.0.0",
            store=str(setup.store),
            into=tmp_path / "cpu-pod",
            backends={Backend.ONNXRUNTIME},
        )


def test_fetch_cli_says_the_endpoint_holds_only_its_manifest(
    built: tuple[Setup, BuildReport], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    setup, _ = built
    args = build_parser().parse_args(
        [
            *("artifacts", "fetch", "--model", MODEL, "--version", "1.0.0"),
            *("--store", str(setup.store), "--into", str(tmp_path / "pod")),
            *("--db", setup.db_url, "--backend", "llamacpp"),
        ]
    )
    assert args.handler(args) == 0
    assert f"its manifest only: served at {Q4_URL}" in capsys.readouterr().out


# -- other readers of a version's artifacts ----------------------------------------------------


def test_onnx_only_readers_say_an_engine_server_serves_the_version(
    built: tuple[Setup, BuildReport],
) -> None:
    from graylane.app.k8s.workers import NothingToDeploy, plan_from_registry
    from graylane.builder.consistency import ConsistencyError, served_variant
    from graylane.topics import TopicLayout

    setup, _ = built
    registry = setup.registry()
    try:
        with pytest.raises(NothingToDeploy, match=r"engine servers serve it: llamacpp"):
            plan_from_registry(registry, MODEL, "1.0.0", layout=TopicLayout())
        with pytest.raises(ConsistencyError, match=r"an engine server \(llamacpp\) serves it"):
            served_variant(registry, MODEL, "1.0.0", Precision.Q4_1, store=setup.store)
    finally:
        registry.engine.dispose()


# -- the probe ---------------------------------------------------------------------------------


class _Engine(BaseHTTPRequestHandler):
    """Answers as llama-server does: /health, and /v1/models listing one model."""

    def do_GET(self) -> None:
        if self.path == "/health":
            self._answer(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self._answer(200, {"object": "list", "data": [{"id": "smollm2", "object": "model"}]})
        else:
            self._answer(404, {"error": "not found"})

    def _answer(self, status: int, doc: object) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def engine_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def closed_url() -> str:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_probe_of_a_serving_engine_records_what_it_lists(engine_url: str) -> None:
    probe = probe_endpoint(engine_url, "smollm2")
    assert probe.models == ("smollm2",) and probe.checked_at.endswith("+00:00")
    with pytest.raises(EndpointProbeError, match=r"lists \['smollm2'\], not .*'other'"):
        probe_endpoint(engine_url, "other")


def test_probe_failures_say_what_the_endpoint_answered(closed_url: str) -> None:
    with pytest.raises(EndpointProbeError, match="no answer"):
        probe_endpoint(closed_url)

    def answers(health: int, models: bytes) -> Any:
        return lambda url, _: (health, b"") if url.endswith("/health") else (200, models)

    with pytest.raises(EndpointProbeError, match=r"/health answered 503 \(still loading"):
        probe_endpoint("http://e:1", get=answers(503, b""))
    with pytest.raises(EndpointProbeError, match="did not answer an OpenAI model list"):
        probe_endpoint("http://e:1", get=answers(200, b"<html>"))
    with pytest.raises(EndpointProbeError, match="lists no model"):
        probe_endpoint("http://e:1", get=answers(200, b'{"data": []}'))


def _cli(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="graylane")
    register_build_cli(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_a_failed_probe_exits_2_and_registers_the_endpoints_that_answered(
    tmp_path: Path, engine_url: str, closed_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    setup = _setup(tmp_path, q4_url=engine_url, q2_url=closed_url, q4_served="smollm2")
    argv = ["build", str(setup.spec_path), "--store", str(setup.store), "--db", setup.db_url]
    args = _cli([*argv, "--probe", "--json"])
    assert args.handler(args) == EXIT_NOT_SERVABLE
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert not report["ok"] and report["registered"]
    assert [(v["precision"], v["status"]) for v in report["variants"]] == [
        ("q4_1", "produced"),
        ("q2_k", "failed"),
    ]
    assert "no answer" in report["variants"][1]["reason"]
    loaded = load_from_registry(setup.settings(), MODEL, "1.0.0")
    (q4,) = loaded.endpoints
    assert (q4.variant, q4.served_model) == ("q4_1", "smollm2")
    registry = setup.registry()
    try:
        (registered,) = registry.list_artifacts(MODEL, "1.0.0")
    finally:
        registry.engine.dispose()
    manifest = verify_artifact(setup.store / registered.path, registered.manifest_sha256)
    assert manifest.endpoint is not None and manifest.endpoint.probe is not None
    assert manifest.endpoint.probe.models == ("smollm2",)
    assert manifest.endpoint.ladder == ("q4_1", "q2_k")  # the ladder as the spec named it


def test_a_build_whose_probes_pass_exits_0(
    tmp_path: Path,
    engine_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # One server, two variants told apart by their served model (an adapter's id).
    setup = _setup(tmp_path, q4_url=engine_url, q2_url=engine_url + "/", q2_served="smollm2")
    monkeypatch.setenv("COLUMNS", "300")
    argv = ["build", str(setup.spec_path), "--store", str(setup.store), "--no-registry"]
    assert _cli(argv).probe is None  # the spec's engine.probe decides
    args = _cli([*argv, "--probe"])
    assert args.handler(args) == EXIT_OK
    assert capsys.readouterr().err.count("answered its probe") == 2


def test_the_readme_engine_spec_parses() -> None:
    import yaml

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("```yaml\n# smollm2.yaml", 1)[1].split("```", 1)[0]
    block = block.split("\n", 1)[1]  # past the title line's remainder
    spec = parse_spec(yaml.safe_load(block), base_dir=Path("/srv"))
    assert isinstance(spec, EngineSpec) and spec.engine.ladder == ("q4_1", "q4_0")


def test_an_engine_spec_may_name_an_evaluation_set_for_its_rungs(tmp_path: Path) -> None:
    def raw(evaluation: object) -> dict[str, object]:
        return {
            "model": "m",
            "version": "1.0.0",
            "engine": {
                "backend": "llamacpp",
                "version": "0.3.36",
                "evaluation": evaluation,
                "variants": [{"precision": "q4_1", "url": "http://127.0.0.1:8081"}],
            },
        }

    spec = parse_spec(raw({"set": "sets/s.jsonl", "max_drop": 0.05}), base_dir=tmp_path)
    assert isinstance(spec, EngineSpec) and spec.engine.evaluation is not None
    assert spec.engine.evaluation.set_path == tmp_path / "sets" / "s.jsonl"
    assert (spec.engine.evaluation.max_drop, spec.engine.evaluation.limit) == (0.05, 0)
    for bad, message in (
        ({"set": "s.jsonl"}, "max_drop"),
        ({"set": "s.jsonl", "max_drop": 1.5}, "0..1"),
        ({"set": "s.jsonl", "max_drop": 0.1, "samples": 3}, "samples"),
    ):
        with pytest.raises(SpecError, match=message):
            parse_spec(raw(bad), base_dir=tmp_path)
    unreadable = parse_spec(raw({"set": "gone.jsonl", "max_drop": 0.1}), base_dir=tmp_path)
    assert isinstance(unreadable, EngineSpec)
    with pytest.raises(BuildError, match=r"engine\.evaluation\.set"):
        run_build(unreadable, store=tmp_path / "store")
