"""Go commands built once and cached: where they are kept, and the progress a first build
prints (a stand-in ``go`` named by ``$GO`` does the "build")."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from graylane.deploy.containers.podman import ContainerToolError
from graylane.deploy.containers.tools import PROGRESS_EVERY, GoTool

FAKE_GO = """#!/bin/sh
# go install -v MODULE@VERSION: one line per package, then the binary in $GOBIN
i=0
while [ $i -lt {packages} ]; do echo "example.com/pkg$i"; i=$((i+1)); done
[ -n "{fail}" ] && {{ echo "compile: broken" >&2; exit 2; }}
mkdir -p "$GOBIN"
printf '#!/bin/sh\\necho built\\n' > "$GOBIN/{name}" && chmod +x "$GOBIN/{name}"
"""


def _fake_go(folder: Path, name: str, packages: int, fail: bool = False) -> Path:
    go = folder / "go"
    go.write_text(FAKE_GO.format(packages=packages, name=name, fail="x" if fail else ""))
    go.chmod(go.stat().st_mode | stat.S_IXUSR)
    return go


@pytest.fixture
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GRAYLANE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GRAYLANE_LOCAL_DIR", str(tmp_path / "local"))
    return tmp_path


def test_a_shared_tool_is_built_once_into_the_machine_cache_with_progress(
    dirs: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tool = GoTool(name="demo", module="example.com/demo/cmd/demo", version="v1.2.3", shared=True)
    monkeypatch.setenv("GO", str(_fake_go(dirs, "demo", packages=2 * PROGRESS_EVERY + 1)))
    built = tool.ensure()
    assert built == dirs / "cache" / "demo-v1.2.3" / "demo" and os.access(built, os.X_OK)
    out = capsys.readouterr().out
    assert "go install example.com/demo/cmd/demo@v1.2.3" in out
    assert f"{PROGRESS_EVERY} packages so far" in out
    assert f"{2 * PROGRESS_EVERY} packages so far" in out
    assert "demo built in" in out
    monkeypatch.setenv("GO", str(dirs / "no-go-here"))  # cached: Go is not asked again
    assert tool.ensure() == built
    assert capsys.readouterr().out == ""


def test_a_clone_tool_stays_under_local_and_a_failed_build_says_why(
    dirs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tool = GoTool(name="demo", module="example.com/demo/cmd/demo", version="v1.2.3")
    assert tool.path() == dirs / "local" / "tools" / "demo-v1.2.3" / "demo"
    monkeypatch.setenv("GO", str(_fake_go(dirs, "demo", packages=3, fail=True)))
    with pytest.raises(ContainerToolError, match="compile: broken"):
        tool.ensure()
    assert not tool.path().exists()
