"""Pinning a built image by digest in a kustomization's ``images:`` list.

After ``make images`` builds the CPU image, the local overlay names it by digest
(``images: - name: graylane, newName: localhost/graylane, digest: sha256:...``) so the
pod specs run exactly the image that was built. The edit is textual: the kustomization's
comments and the other entries stay as written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LOCAL_KUSTOMIZATION", "ImagePin", "pin_image", "write_pin"]

LOCAL_KUSTOMIZATION = (
    Path(__file__).resolve().parents[1] / "k8s" / "overlays" / "local" / "kustomization.yaml"
)
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_ITEM = re.compile(r"^(?P<indent>\s*)- ")


@dataclass(frozen=True)
class ImagePin:
    name: str
    """The image name the manifests use (``graylane``)."""
    new_name: str
    """Where it is now (``localhost/graylane``)."""
    digest: str

    def __post_init__(self) -> None:
        if not _DIGEST.fullmatch(self.digest):
            raise ValueError(f"{self.digest!r} is not a sha256 image digest")

    def lines(self, indent: str) -> list[str]:
        pad = indent + "  "
        return [
            f"{indent}- name: {self.name}",
            f"{pad}newName: {self.new_name}",
            f"{pad}digest: {self.digest}",
        ]


def pin_image(text: str, pin: ImagePin) -> str:
    """``text`` (a kustomization) with ``pin``'s entry in ``images:`` replaced or added."""
    lines = text.splitlines()
    try:
        start = lines.index("images:")
    except ValueError:
        return text.rstrip("\n") + "\n" + "\n".join(["images:", *pin.lines("  ")]) + "\n"
    end = start + 1
    while end < len(lines) and (lines[end].startswith((" ", "-")) or not lines[end].strip()):
        end += 1
    block = lines[start + 1 : end]
    items: list[list[str]] = []
    for line in block:
        if _ITEM.match(line) or not items:
            items.append([line])
        else:
            items[-1].append(line)
    first = next((_ITEM.match(i[0]) for i in items if _ITEM.match(i[0])), None)
    indent = first.group("indent") if first else "  "

    def named(item: list[str]) -> bool:
        fields = [re.sub(r"^\s*-?\s*", "", line) for line in item]
        return f"name: {pin.name}" in fields

    kept = [pin.lines(indent) if named(i) else i for i in items]
    if not any(named(i) for i in items):
        kept.append(pin.lines(indent))
    out = [*lines[: start + 1], *(line for item in kept for line in item), *lines[end:]]
    return "\n".join(out) + "\n"


def write_pin(pin: ImagePin, path: Path = LOCAL_KUSTOMIZATION) -> Path:
    path.write_text(pin_image(path.read_text(), pin))
    return path
