"""Podman on this kind of machine: Debian packages, a runtime config, and a thin runner.

There is no Docker engine here. ``podman``/``buildah`` with ``runc`` build and run images,
``podman kube play`` starts Kubernetes pod specs. Everything the machine lacks is installed
from the Debian mirror apt already uses (root only), so a fresh clone needs nothing by hand.

The runtime settings go to a file of our own named by ``CONTAINERS_CONF`` for our commands;
the machine's global ``/etc/containers/containers.conf`` is left as it is.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from graylane.deploy.kafka.layout import REPO_ROOT
from graylane.errors import GraylaneError

__all__ = [
    "CONTAINERS_CONF",
    "PACKAGES",
    "ContainerToolError",
    "KubePlay",
    "Podman",
    "apt_install",
    "containers_dir",
    "ensure_packages",
    "job_as_pod",
    "kube_play_form",
    "say",
    "secret_payloads",
]

# Debian packages the image build and the pod test need (binary they provide -> package).
PACKAGES: dict[str, str] = {
    "podman": "podman",
    "buildah": "buildah",
    "runc": "runc",
    "debootstrap": "debootstrap",
    "newuidmap": "uidmap",
    "fuse-overlayfs": "fuse-overlayfs",
    "catatonit": "catatonit",  # the init of podman's pod infra ("pause") image
}

# crun refuses this machine's hybrid cgroup layout and the default ulimits are above what
# the machine allows: runc and modest limits.
CONTAINERS_CONF = """\
# Written by deploy/containers for graylane's own podman commands (CONTAINERS_CONF).
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]
[engine]
runtime = "runc"
"""


class ContainerToolError(GraylaneError):
    """A container tool is missing and cannot be installed, or a podman command failed."""


def say(msg: str) -> None:
    print(f"[containers] {msg}", flush=True)


def containers_dir() -> Path:
    """Where the container helpers keep their state: ``<GRAYLANE_LOCAL_DIR>/containers``."""
    base = os.environ.get("GRAYLANE_LOCAL_DIR") or str(REPO_ROOT / ".local")
    return Path(base).expanduser().resolve() / "containers"


def apt_install(packages: Sequence[str]) -> None:
    """``apt-get install`` (``apt-get update`` once when the first try fails); root only."""
    if not shutil.which("apt-get") or os.geteuid() != 0:
        raise ContainerToolError(
            f"missing {' '.join(packages)}; install them with "
            f"`sudo apt-get install -y {' '.join(packages)}`"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
    for attempt in (1, 2):
        say("$ " + " ".join(install))
        res = subprocess.run(install, env=env, capture_output=True, text=True, check=False)
        if res.returncode == 0:
            return
        if attempt == 1:  # stale or missing package lists: refresh once
            say("$ apt-get update")
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=False)
    tail = "\n".join((res.stdout + res.stderr).splitlines()[-20:])
    raise ContainerToolError(f"apt-get install failed:\n{tail}")


def ensure_packages() -> None:
    """Install the Debian packages whose binaries are missing (nothing when all are there)."""
    missing = [pkg for binary, pkg in PACKAGES.items() if not _which(binary)]
    if missing:
        say(f"installing {' '.join(missing)} from the Debian mirror (once per machine)")
        apt_install(missing)
    still = [b for b in PACKAGES if not _which(b)]
    if still:
        raise ContainerToolError(f"still missing after apt-get install: {' '.join(still)}")


def _which(binary: str) -> str | None:
    return shutil.which(binary) or shutil.which(binary, path="/usr/sbin:/sbin:/usr/bin")


@dataclass(frozen=True, kw_only=True)
class Podman:
    """Runs ``podman`` with our ``CONTAINERS_CONF``; output streamed as progress lines."""

    conf: Path

    @classmethod
    def ready(cls) -> Podman:
        """Packages installed, our containers.conf written: a runner to use."""
        ensure_packages()
        conf = containers_dir() / "containers.conf"
        conf.parent.mkdir(parents=True, exist_ok=True)
        if not conf.is_file() or conf.read_text() != CONTAINERS_CONF:
            conf.write_text(CONTAINERS_CONF)
        return cls(conf=conf)

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return {**os.environ, "CONTAINERS_CONF": str(self.conf), **(extra or {})}

    def run(
        self,
        args: Sequence[str],
        *,
        check: bool = True,
        stream: bool = False,
        stdin: bytes | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``podman ARGS``; with ``stream`` every output line is echoed as it comes; ``env``
        adds to (or overrides) the environment of that one command."""
        cmd = ["podman", *args]
        if not stream:
            res = subprocess.run(
                cmd,
                env=self.env(env),
                input=stdin.decode() if stdin is not None else None,
                capture_output=True,
                text=True,
                check=False,
                timeout=timeout,
            )
            if check and res.returncode != 0:
                raise ContainerToolError(
                    f"{' '.join(cmd[:4])} ... failed ({res.returncode}):\n{res.stderr[-4000:]}"
                )
            return res
        say("$ " + " ".join(cmd))
        t0 = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            env=self.env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
        )
        assert proc.stdout is not None
        lines: list[str] = []
        for line in proc.stdout:
            line = line.rstrip("\n")
            lines.append(line)
            print(f"  {line}", flush=True)
        rc = proc.wait()
        say(f"  ({time.monotonic() - t0:.0f}s, exit {rc})")
        if check and rc != 0:
            tail = "\n".join(lines[-30:])
            raise ContainerToolError(f"{' '.join(cmd[:3])} failed ({rc}):\n{tail}")
        return subprocess.CompletedProcess(cmd, rc, "\n".join(lines), "")

    def prune_dangling(self, *, max_passes: int = 100) -> int:
        """Remove the images no tag, container or child image holds: the stages of builds
        since replaced. Every build of changed code leaves its stages behind (hundreds of
        megabytes each), and without this they fill the disk over weeks of test runs.

        One image at a time, pass after pass (a removed stage's parent is the next pass's
        leaf): ``podman image prune`` gives up on all of them when one is held by a
        container a crashed build left behind. Returns how many were removed."""
        self.drop_stale_build_containers()
        removed = 0
        for _ in range(max_passes):
            listed = self.run(["images", "--quiet", "--filter", "dangling=true"], check=False)
            ids = list(dict.fromkeys(listed.stdout.split()))
            gone = [i for i in ids if self.run(["rmi", i], check=False).returncode == 0]
            removed += len(gone)
            if not gone:
                break
        if removed:
            say(f"removed {removed} image(s) earlier builds left")
        return removed

    def drop_stale_build_containers(self, older_than: str = "1h") -> int:
        """Remove the working containers of builds that ended long ago without cleaning up
        (a build that crashed): each holds its image, so nothing under it could be pruned.
        A build still running is younger than ``older_than``. Returns how many."""
        listed = self.run(
            ["ps", "--all", "--external", "--filter", f"until={older_than}", "--format", "json"],
            check=False,
        )
        try:
            found = json.loads(listed.stdout or "[]")
        except json.JSONDecodeError:
            return 0
        stale = [c["Id"] for c in found if c.get("State") == "storage"]  # a build's, not ours
        gone = [i for i in stale if self.run(["rm", "--force", i], check=False).returncode == 0]
        if gone:
            say(f"removed {len(gone)} working container(s) of builds that ended long ago")
        return len(gone)

    def image_exists(self, ref: str) -> bool:
        return self.run(["image", "exists", ref], check=False).returncode == 0

    def image_digest(self, ref: str) -> str:
        """The image's ID-independent digest (``sha256:...``) as podman records it."""
        out = self.run(["image", "inspect", "--format", "{{.Digest}}", ref]).stdout.strip()
        if not out.startswith("sha256:"):
            raise ContainerToolError(f"no digest for {ref}: {out!r}")
        return out


# -- podman kube play ---------------------------------------------------------------------------
# Debian 12's podman (4.3) reads a Secret for `env.valueFrom.secretKeyRef` as a JSON map of
# base64 values and for a `secret` volume as a Secret object whose `data` holds plain text;
# a Secret played from the YAML itself serves neither. So Secrets are created beforehand, in
# the form each use reads, and the rest is played as written.

Doc = dict[str, Any]


def _secret_uses(docs: Sequence[Doc]) -> dict[str, set[str]]:
    uses: dict[str, set[str]] = {}
    for doc in docs:
        if doc.get("kind") not in ("Deployment", "Pod"):
            continue
        pod = doc["spec"] if doc["kind"] == "Pod" else doc["spec"]["template"]["spec"]
        for volume in pod.get("volumes", []):
            if "secret" in volume:
                uses.setdefault(volume["secret"]["secretName"], set()).add("volume")
        for container in [*pod.get("initContainers", []), *pod.get("containers", [])]:
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    uses.setdefault(ref["name"], set()).add("env")
    return uses


def _secret_values(doc: Doc) -> dict[str, bytes]:
    values = {k: base64.b64decode(v or "") for k, v in (doc.get("data") or {}).items()}
    values.update({k: (v or "").encode() for k, v in (doc.get("stringData") or {}).items()})
    return values


def secret_payloads(docs: Sequence[Doc]) -> dict[str, bytes]:
    """Each Secret as the podman secret its use reads (see above); refuses a Secret used
    both as env and as a volume (this podman cannot serve both from one)."""
    uses = _secret_uses(docs)
    payloads: dict[str, bytes] = {}
    for doc in docs:
        if doc.get("kind") != "Secret":
            continue
        name = doc["metadata"]["name"]
        values = _secret_values(doc)
        how = uses.get(name, {"volume"})
        if how == {"env", "volume"}:
            raise ContainerToolError(f"Secret {name} is used as env and as a volume")
        if how == {"env"}:
            body: object = {k: base64.b64encode(v).decode() for k, v in values.items()}
        else:
            body = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": name},
                "data": {k: v.decode() for k, v in values.items()},
            }
        payloads[name] = json.dumps(body).encode()
    return payloads


INIT_TYPE_ANNOTATION = "io.podman.annotations.init.container.type"
"""podman's own annotation choosing how a pod's init containers run (once, always)."""


def kube_play_form(doc: Doc) -> Doc:
    """The Deployment as this podman plays it, meaning unchanged: ``optional: false`` spelt
    out on secret volumes (it crashes on one that leaves the default unset), init
    containers kept once they exited, and on the host network no ``ports`` list (it turns
    each into a port mapping, which host networking refuses) with the probes' named ports
    written as numbers."""
    if doc.get("kind") not in ("Deployment", "Pod"):
        return doc
    out = copy.deepcopy(doc)
    pod = out["spec"] if out["kind"] == "Pod" else out["spec"]["template"]["spec"]
    for volume in pod.get("volumes", []):
        if "secret" in volume:
            volume["secret"].setdefault("optional", False)
    if pod.get("initContainers"):
        # podman's default init type, "once", removes an init container as it exits and
        # can lose that race ("cannot remove container ... as it is running"); "always"
        # keeps it, which is what a kubelet does too.
        metas = [out["metadata"]]
        if out["kind"] == "Deployment":
            metas.append(out["spec"]["template"].setdefault("metadata", {}))
        for meta in metas:
            meta.setdefault("annotations", {})[INIT_TYPE_ANNOTATION] = "always"
    if pod.get("hostNetwork"):
        for container in [*pod.get("initContainers", []), *pod.get("containers", [])]:
            named = {
                p["name"]: p["containerPort"] for p in container.pop("ports", []) if "name" in p
            }
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                action = container.get(probe, {}).get("httpGet")
                if action and isinstance(action.get("port"), str):
                    action["port"] = named[action["port"]]
    return out


@dataclass(frozen=True, kw_only=True)
class KubePlay:
    """Pod specs started with ``podman kube play`` (their Secrets created first)."""

    podman: Podman
    spec: Path
    secrets: tuple[str, ...]
    env: Mapping[str, str] | None = None

    @classmethod
    def start(
        cls,
        podman: Podman,
        docs: Sequence[Doc],
        spec: Path,
        *,
        options: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> KubePlay:
        """Play ``docs``; ``options`` go to ``podman kube play`` (e.g. a signature policy)
        and ``env`` to its environment (e.g. the registries.d that finds signatures)."""
        payloads = secret_payloads(docs)
        for name, payload in payloads.items():
            podman.run(["secret", "rm", name], check=False)
            podman.run(["secret", "create", name, "-"], stdin=payload)
        rest = [kube_play_form(d) for d in docs if d.get("kind") != "Secret"]
        spec.write_text(yaml.safe_dump_all(rest, sort_keys=False))
        played = cls(podman=podman, spec=spec, secrets=tuple(payloads), env=env)
        try:
            podman.run(["kube", "play", *options, str(spec)], stream=True, timeout=900, env=env)
        except BaseException:
            played.down()
            raise
        return played

    def pods(self) -> list[str]:
        out = self.podman.run(["pod", "ps", "--format", "{{.Name}}"], check=False).stdout
        return out.split()

    def logs(self, pod: str, tail: int = 200) -> str:
        res = self.podman.run(["pod", "logs", "--tail", str(tail), pod], check=False)
        return res.stdout + res.stderr

    def down(self) -> None:
        self.podman.run(["kube", "down", str(self.spec)], check=False, timeout=300, env=self.env)
        for name in self.secrets:
            self.podman.run(["secret", "rm", name], check=False)


def job_as_pod(job: Doc) -> Doc:
    """A Job's pod template as a Pod of the Job's name (this podman does not play Jobs)."""
    template = job["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": job["metadata"]["name"],
            "labels": dict(template.get("metadata", {}).get("labels", {})),
        },
        "spec": copy.deepcopy(template["spec"]),
    }
