"""Generate the Python code of the graylane.v1 contracts.

Usage: python protos/generate.py [--check]

The generated modules land in graylane/v1/ (their import path follows the proto
package). With --check, code is generated into a temporary folder and compared
with the checked-in files; any difference exits non-zero.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
PROTO_DIR = PROTO_ROOT / "graylane" / "v1"
OUT_PACKAGE = ROOT / "graylane" / "v1"
# The generated code records the protoc version; pin it so regeneration is stable.
GRPC_TOOLS_VERSION = "1.85.1"
INIT_TEXT = (
    '"""Generated protobuf contracts of graylane.v1 (do not edit; see protos/generate.py)."""\n'
)


def _generate(out_root: Path) -> None:
    from importlib.metadata import version

    from grpc_tools import protoc

    found = version("grpcio-tools")
    if found != GRPC_TOOLS_VERSION:
        sys.exit(f"grpcio-tools {GRPC_TOOLS_VERSION} is required to regenerate, found {found}")
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_DIR.glob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *protos,
    ]
    if protoc.main(args) != 0:
        sys.exit("protoc failed")
    pkg = out_root / "graylane" / "v1"
    (pkg / "__init__.py").write_text(INIT_TEXT)
    # grpc_python_out writes an (almost) empty module for protos without services.
    for grpc_file in pkg.glob("*_pb2_grpc.py"):
        if "Stub" not in grpc_file.read_text():
            grpc_file.unlink()


def _generated_files(pkg: Path) -> set[str]:
    return {p.name for p in pkg.iterdir() if p.suffix in {".py", ".pyi"}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if checked-in code is stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out_root = Path(tmp)
        _generate(out_root)
        fresh = out_root / "graylane" / "v1"
        if args.check:
            names = _generated_files(fresh) | _generated_files(OUT_PACKAGE)
            stale = [
                n
                for n in sorted(names)
                if not (OUT_PACKAGE / n).exists()
                or not (fresh / n).exists()
                or not filecmp.cmp(fresh / n, OUT_PACKAGE / n, shallow=False)
            ]
            if stale:
                print("stale generated code: " + ", ".join(stale) + " (run protos/generate.py)")
                return 1
            print(f"generated code is up to date ({len(names)} files)")
            return 0
        for old in OUT_PACKAGE.glob("*_pb2*.py*"):
            old.unlink()
        OUT_PACKAGE.mkdir(parents=True, exist_ok=True)
        for f in fresh.iterdir():
            if f.suffix in {".py", ".pyi"}:
                shutil.copy2(f, OUT_PACKAGE / f.name)
        print(f"generated {len(_generated_files(OUT_PACKAGE))} files in {OUT_PACKAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
