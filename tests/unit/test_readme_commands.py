"""Every ``graylane ...`` command in the READMEs' shell code blocks parses with the real
parser: a renamed command or flag fails here, not in a new operator's first hour.
And the builder's module table lists exactly the builder's modules."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from graylane.app.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
READMES = (ROOT / "README.md", ROOT / "builder" / "README.md")
SHELL_FENCES = ("", "bash", "sh", "shell", "console")
_VAR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def shell_blocks(text: str) -> list[tuple[int, str]]:
    """``(first line number, text)`` of each shell code block."""
    blocks, lines, start, fence = [], text.splitlines(), 0, None
    for n, line in enumerate(lines, start=1):
        if line.startswith("```"):
            if fence is None:
                fence, start = line[3:].strip(), n + 1
            else:
                if fence in SHELL_FENCES:
                    blocks.append((start, "\n".join(lines[start - 1 : n - 1])))
                fence = None
    return blocks


def commands(path: Path) -> list[tuple[str, list[str]]]:
    """``(where, argv after "graylane")`` of every command in ``path``'s shell blocks."""
    found = []
    for start, block in shell_blocks(path.read_text()):
        joined = block.replace("\\\n", " ")
        for offset, line in enumerate(joined.splitlines()):
            try:
                words = shlex.split(line, comments=True)
            except ValueError:
                continue
            parts: list[list[str]] = [[]]
            for word in words:
                if word in ("&&", "||", ";", "|"):
                    parts.append([])
                else:
                    parts[-1].append(word)
            for argv in parts:
                while argv and _VAR.match(argv[0]):
                    argv = argv[1:]  # VAR=value before the command
                if argv and argv[-1] == "&":
                    argv = argv[:-1]
                if argv and (argv[0] == "graylane" or argv[0].endswith("/graylane")):
                    where = f"{path.relative_to(ROOT)}:{start + offset}"
                    found.append((where, argv[1:]))
    return found


ALL = [c for readme in READMES for c in commands(readme)]


def test_the_readmes_show_commands() -> None:
    assert len(ALL) > 60  # the extractor found them (a broken one would find none)
    shown = {argv[0] for _, argv in ALL if argv}
    assert {"serve", "rollout", "build", "config", "model"} <= shown


@pytest.mark.parametrize(("where", "argv"), ALL, ids=[w for w, _ in ALL])
def test_every_readme_command_parses(where: str, argv: list[str]) -> None:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"{where}: `graylane {shlex.join(argv)}` does not parse (exit {exc.code})")
    assert callable(args.handler), where
    assert getattr(args, "old_spelling", None) is None, f"{where}: shows a deprecated spelling"


def test_the_builder_readme_lists_exactly_the_builder_modules() -> None:
    text = (ROOT / "builder" / "README.md").read_text()
    section = text.split("## Modules", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([\w/]+\.py)` \|", section, re.M))
    present = {p.name for p in (ROOT / "builder").glob("*.py") if p.name != "__init__.py"}
    assert listed == present


def test_the_environment_table_states_the_real_defaults() -> None:
    from graylane.settings import Settings

    defaults = Settings()
    text = (ROOT / "README.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `GRAYLANE_PARTITIONS`"))
    assert f"`{defaults.partitions}`, `{defaults.replication_factor}`" in row


def test_the_parser_walk_sees_subcommands() -> None:
    parser = build_parser()
    assert any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)
