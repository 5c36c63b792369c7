"""The CLI's habits without a server: help on every flag, the old server spellings,
contexts and their precedence, the exit codes of ``status --wait``, stable JSON, and
a completion script generated from the parser."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from graylane.app.cli.completion import bash_script, command_paths
from graylane.app.cli.contexts import (
    DEFAULT_ADDRESS,
    ConfigError,
    ConnectionFlags,
    Context,
    ContextFile,
    resolve,
)
from graylane.app.cli.main import LEGACY_SERVER_COMMANDS, build_parser, main, serve_argv
from graylane.app.cli.rollouts import WAIT_EXIT_CODES, wait_outcome
from graylane.app.cli.views import document
from graylane.rollouts.vocabulary import Phase
from graylane.v1 import rollout_pb2


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return build_parser()


def test_every_flag_and_argument_has_help(parser: argparse.ArgumentParser) -> None:
    missing = [
        f"graylane {' '.join(path)} {'/'.join(a.option_strings) or a.dest}"
        for path, sub in command_paths(parser)
        for a in sub._actions
        if not isinstance(a, argparse._SubParsersAction | argparse._HelpAction) and not a.help
    ]
    assert missing == []
    assert len(list(command_paths(parser))) > 60  # the walk reached every level


def test_servers_live_under_serve_and_the_old_spellings_still_parse(
    parser: argparse.ArgumentParser,
) -> None:
    served = {p[1] for p, _ in command_paths(parser) if len(p) == 2 and p[0] == "serve"}
    assert served >= LEGACY_SERVER_COMMANDS
    listed = parser.format_help()
    assert re.search(r"^    serve ", listed, re.M)
    assert not any(re.search(rf"^    {c} ", listed, re.M) for c in LEGACY_SERVER_COMMANDS)
    old = parser.parse_args(["-v", "router", "--model", "m=1.0.0"])
    new = parser.parse_args(["serve", "router", "--model", "m=1.0.0"])
    assert (old.handler, old.model, old.old_spelling) == (new.handler, new.model, "router")
    assert not hasattr(new, "old_spelling")
    assert serve_argv(["worker", "--model", "m"]) == ["serve", "worker", "--model", "m"]
    assert serve_argv(["rollout", "list"]) == ["rollout", "list"]


def test_the_old_spelling_warns_on_stderr(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GRAYLANE_DB_URL", f"sqlite:///{tmp_path / 'never.db'}")
    monkeypatch.delenv("GRAYLANE_CP_TOKENS", raising=False)
    with pytest.raises(SystemExit, match="no tokens configured"):
        main(["controlplane"])  # refused at once: no server starts
    captured = capsys.readouterr()
    assert "deprecated" in captured.err and "graylane serve controlplane" in captured.err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.startswith("graylane ")


def test_abort_and_undo_are_different_verbs(parser: argparse.ArgumentParser) -> None:
    abort = parser.parse_args(["rollout", "abort", "gpt"])
    undo = parser.parse_args(["rollout", "undo", "gpt"])
    assert abort.handler is not undo.handler
    assert (abort.action, abort.rollout) == ("abort", "gpt")
    assert undo.target == "gpt"
    rollback = parser.parse_args(["rollout", "rollback", "ro-x"])
    assert rollback.action == "rollback"  # kept for one release, with a note


def test_wait_exit_codes() -> None:
    from graylane.rollouts.pb import phase_to_pb

    assert WAIT_EXIT_CODES == {Phase.PROMOTED: 0, Phase.ROLLED_BACK: 1, Phase.ABORTED: 1}
    for phase in Phase:
        expected = WAIT_EXIT_CODES.get(phase)
        assert wait_outcome(phase_to_pb(phase)) == expected, phase
        assert (expected is None) == (not phase.finished)


def test_contexts_round_trip_and_precedence(tmp_path: Path) -> None:
    token = tmp_path / "prod.token"
    token.write_text("prod-token-123\n")
    path = tmp_path / "config.yaml"
    config = ContextFile().with_context(
        Context(name="prod", address="cp.prod:443", token_file=token, ca=tmp_path / "ca.pem")
    )
    config = config.with_context(Context(name="local", address="127.0.0.1:50051")).use("prod")
    config.save(path)
    loaded = ContextFile.load(path)
    assert loaded == config

    conn = resolve(ConnectionFlags(), {}, loaded)
    assert (conn.address, conn.token, conn.ca, conn.context) == (
        "cp.prod:443",
        "prod-token-123",
        tmp_path / "ca.pem",
        "prod",
    )
    other = resolve(ConnectionFlags(context="local"), {}, loaded)
    assert (other.address, other.token, other.ca) == ("127.0.0.1:50051", "", None)
    env = {"GRAYLANE_CP_ADDR": "env:1", "GRAYLANE_TOKEN": "env-token"}
    from_env = resolve(ConnectionFlags(), env, loaded)
    assert (from_env.address, from_env.token) == ("env:1", "env-token")
    flag_token = tmp_path / "flag.token"
    flag_token.write_text("flag-token")
    flags = ConnectionFlags(address="flag:2", token_file=flag_token)
    from_flags = resolve(flags, env, loaded)
    assert (from_flags.address, from_flags.token) == ("flag:2", "flag-token")
    assert resolve(ConnectionFlags(), {}, ContextFile()).address == DEFAULT_ADDRESS
    assert "prod-token" not in repr(conn)  # a token never shows in a log line
    with pytest.raises(ConfigError, match="no context named 'staging'"):
        resolve(ConnectionFlags(context="staging"), {}, loaded)


def test_a_context_file_relative_paths_are_beside_it(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "config.yaml"
    path.parent.mkdir()
    path.write_text(
        "current-context: a\ncontexts:\n  - name: a\n    address: h:1\n    token-file: a.token\n"
    )
    (path.parent / "a.token").write_text("tok")
    assert resolve(ConnectionFlags(), {}, ContextFile.load(path)).token == "tok"
    path.write_text("contexts: 3\n")
    with pytest.raises(ConfigError):
        ContextFile.load(path)


def test_use_context_through_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GRAYLANE_CONFIG", str(tmp_path / "c.yaml"))
    assert main(["config", "set-context", "a", "--addr", "h:1"]) == 0
    assert main(["config", "set-context", "b", "--addr", "h:2"]) == 0
    capsys.readouterr()
    assert main(["config", "current-context"]) == 0
    assert capsys.readouterr().out.strip() == "a"  # the first one written became current
    assert main(["config", "use-context", "b"]) == 0
    assert ContextFile.load(tmp_path / "c.yaml").current == "b"
    with pytest.raises(SystemExit, match="no context named 'zz'"):
        main(["config", "use-context", "zz"])


def test_json_documents_name_every_field_and_keep_their_shape() -> None:
    state = rollout_pb2.RolloutState(rollout_id="ro-1", model="gpt", phase=rollout_pb2.PROMOTED)
    doc = document("RolloutList", [state])
    assert json.loads(json.dumps(doc)) == doc
    assert (doc["apiVersion"], doc["kind"]) == ("graylane.v1", "RolloutList")
    [item] = doc["items"]
    assert item["phase"] == "PROMOTED" and item["rollout_id"] == "ro-1"
    scalar = {f.name for f in rollout_pb2.RolloutState.DESCRIPTOR.fields if not f.has_presence}
    assert scalar <= set(item)  # defaults too: a reader never meets a missing key
    assert item["updated_at_unix_ms"] == "0"  # int64 as a string (protobuf's JSON mapping)
    single = document("RolloutState", single=state)
    assert single["object"] == item


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash here")
def test_the_completion_script_completes_every_level(parser: argparse.ArgumentParser) -> None:
    script = bash_script(parser)

    def complete(*words: str) -> list[str]:
        line = " ".join(f"'{w}'" for w in words)
        probe = (
            f"{script}\nCOMP_WORDS=(graylane {line}); COMP_CWORD={len(words)}; _graylane; "
            'printf "%s\\n" "${COMPREPLY[@]}"'
        )
        done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True)
        return done.stdout.split()

    assert complete("ro") == ["rollout", "route"]
    assert complete("rollout", "st") == ["start", "status"]
    assert "--wait" in complete("rollout", "status", "--")
    assert complete("serve", "w") == ["worker"]
    assert "use-context" in complete("config", "")


def test_rollout_start_sends_the_bake_period(
    parser: argparse.ArgumentParser, monkeypatch: pytest.MonkeyPatch
) -> None:
    from graylane.app.cli import rollouts

    sent: list[rollout_pb2.RolloutSpec] = []

    def call(args: object, service: str, method: str, spec: rollout_pb2.RolloutSpec) -> object:
        sent.append(spec)
        return rollout_pb2.RolloutState(rollout_id="ro-x", spec=spec)

    monkeypatch.setattr(rollouts, "call", call)
    argv = ["rollout", "start", "--model", "m", "--candidate", "1.1.0", "--bake-s", "600"]
    args = parser.parse_args([*argv, "-o", "name"])
    assert args.handler(args) == 0
    assert [s.bake_s for s in sent] == [600.0]


def test_the_status_of_a_baking_rollout_shows_the_time_left() -> None:
    from graylane.app.cli.views import bake_text, state_rows

    spec = rollout_pb2.RolloutSpec(bake_s=600.0)
    baking = rollout_pb2.RolloutState(
        phase=rollout_pb2.BAKING, bake_until_unix_ms=1_000_000, spec=spec
    )
    assert bake_text(baking, now=760_000).startswith("baking, 240s left of 600s (until ")
    assert ("phase", "baking") in state_rows(baking)
    done = rollout_pb2.RolloutState(phase=rollout_pb2.PROMOTED, spec=spec)
    assert bake_text(done) == "600s after the promotion"
    assert bake_text(rollout_pb2.RolloutState(phase=rollout_pb2.PROMOTED)) == ""
