"""What a build leaves behind is removed: dangling stages pass after pass (a removed stage's
parent is the next leaf), past an image a crashed build's container still holds, and
only working containers of builds that ended long ago."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graylane.deploy.containers.podman import Podman


@dataclass
class FakeStore:
    parents: dict[str, str | None]
    """Untagged images and their parent (None: a tagged one's child chain ends there)."""
    held: set[str] = field(default_factory=set)
    """Images a container holds: ``rmi`` refuses them."""
    containers: list[dict[str, Any]] = field(default_factory=list)
    calls: list[tuple[str, ...]] = field(default_factory=list)

    def leaves(self) -> list[str]:
        children = {p for p in self.parents.values() if p is not None}
        return [i for i in self.parents if i not in children]


class FakePodman(Podman):
    def __init__(self, store: FakeStore) -> None:
        super().__init__(conf=Path("/nonexistent"))
        self.store = store

    def run(self, args: Sequence[str], **_: Any) -> subprocess.CompletedProcess[str]:
        store = self.store
        store.calls.append(tuple(args))
        out, rc = "", 0
        if args[0] == "images":
            out = "\n".join(store.leaves())
        elif args[0] == "rmi":
            if args[1] in store.held:
                rc = 1
            else:
                del store.parents[args[1]]
        elif args[0] == "ps":
            out = json.dumps(store.containers)
        elif args[0] == "rm":
            store.containers = [c for c in store.containers if c["Id"] != args[-1]]
        return subprocess.CompletedProcess(list(args), rc, out, "")


def test_stages_are_removed_pass_after_pass_past_one_that_is_held() -> None:
    # two old chains: a -> b -> c (c the leaf) and x -> y, whose leaf y a container holds
    store = FakeStore(parents={"a": None, "b": "a", "c": "b", "x": None, "y": "x"}, held={"y"})
    removed = FakePodman(store).prune_dangling()
    assert removed == 3 and set(store.parents) == {"x", "y"}
    assert sum(1 for c in store.calls if c[0] == "images") == 4  # 3 passes with progress + 1


def test_only_the_working_containers_of_builds_long_over_are_removed() -> None:
    store = FakeStore(
        parents={},
        containers=[
            {"Id": "build-1", "State": "storage"},  # a crashed build's working container
            {"Id": "pod-1", "State": "exited"},  # podman's own: left to its owner
        ],
    )
    assert FakePodman(store).drop_stale_build_containers() == 1
    assert [c["Id"] for c in store.containers] == ["pod-1"]
    (ps,) = [c for c in store.calls if c[0] == "ps"]
    assert "until=1h" in ps  # younger ones may be a build still running
