"""Type-checks the ``graylane`` distribution with mypy, each module under its one import name.

The design's top-level folders (``services/``, ``engine_worker/``, ``app/``, ...) install
as sub-packages of ``graylane`` through setuptools' ``package-dir`` map
(``pyproject.toml``). mypy finds modules by path, so run on the folders it would name
``services/gateway/service.py`` ``services.gateway.service`` and never find
``graylane.services.gateway.service``. This hands mypy every module of the distribution
with the name the map gives it, through mypy's own build API, with the options of
``[tool.mypy]``.

    .venv/bin/python scripts/typecheck.py [mypy options]
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

from mypy import build
from mypy.errors import CompileError
from mypy.main import process_options
from mypy.modulefinder import BuildSource

ROOT = Path(__file__).resolve().parents[1]


def package_map(root: Path = ROOT) -> dict[str, Path]:
    """Each package of the distribution and its folder: ``graylane.services.gateway`` ->
    ``services/gateway/`` by the map, the rest by path (``graylane.kafka`` ->
    ``graylane/kafka/``)."""
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped: dict[str, str] = config["package-dir"]
    found: dict[str, Path] = {}
    for package in config["packages"]:
        parts = package.split(".")
        for n in range(len(parts), 0, -1):  # the longest mapped prefix wins, as in setuptools
            prefix = ".".join(parts[:n])
            if prefix in mapped:
                found[package] = root.joinpath(mapped[prefix], *parts[n:])
                break
        else:
            found[package] = root.joinpath(*parts)
    return found


def sources(root: Path, exclude: list[str]) -> list[BuildSource]:
    """One source per module, named as it is imported; a file whose path matches one of
    mypy's ``exclude`` patterns is left out."""
    out: list[BuildSource] = []
    for package, folder in sorted(package_map(root).items()):
        for path in sorted(folder.glob("*.py")):
            rel = path.relative_to(root).as_posix()
            if any(re.search(pattern, rel) for pattern in exclude):
                continue
            module = package if path.stem == "__init__" else f"{package}.{path.stem}"
            out.append(BuildSource(rel, module, None, str(root)))
    return out


def main(argv: list[str]) -> int:
    _, options = process_options([*argv, "-c", "pass"])  # options only; sources are ours
    todo = sources(ROOT, options.exclude)
    try:
        result = build.build(todo, options, stdout=sys.stdout, stderr=sys.stderr)
    except CompileError as err:
        for line in err.messages:
            print(line)
        return 2
    for line in result.errors:
        print(line)
    if result.errors:
        problems = sum(": error:" in line for line in result.errors)
        print(f"Found {problems} errors (checked {len(todo)} source files)")
        return 1
    print(f"Success: no issues found in {len(todo)} source files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
