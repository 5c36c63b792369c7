#!/usr/bin/env python3
"""Build and run the project's images here with podman (installed from Debian when missing).

Usage::

    python deploy/containers/containers.py setup   # packages + runtime config + kustomize, helm
    python deploy/containers/containers.py base    # the Debian base image (debootstrap)
    python deploy/containers/containers.py build   # the CPU image FROM that base, pinned by
                                                   # digest in deploy/k8s/overlays/local, then
                                                   # signed into the local registry and
                                                   # verified (--no-push: build only;
                                                   # --no-cosign: no cosign signature)
    python deploy/containers/containers.py llamacpp  # llama-server FROM that base (needs
                                                     # `make engines` first)
"""

from __future__ import annotations

import argparse
import sys

from graylane.deploy.containers.engine_images import build_llamacpp_image
from graylane.deploy.containers.images import base_image, build_cpu_image
from graylane.deploy.containers.pinning import ImagePin, write_pin
from graylane.deploy.containers.podman import ContainerToolError, Podman, say
from graylane.deploy.containers.signing import publish
from graylane.deploy.containers.tools import HELM, KUSTOMIZE

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "command", choices=["setup", "base", "build", "llamacpp"], nargs="?", default="build"
    )
    parser.add_argument(
        "--no-push",
        action="store_true",
        help="build only: do not sign and push to the local registry",
    )
    parser.add_argument(
        "--no-cosign",
        action="store_true",
        help="sign for podman only, without the cosign signature a cluster checks",
    )
    args = parser.parse_args(argv)
    try:
        podman = Podman.ready()
        if args.command == "setup":
            for tool in (KUSTOMIZE, HELM):
                print(tool.ensure())
        elif args.command == "base":
            print(base_image(podman))
        elif args.command == "build":
            built = build_cpu_image(podman)
            print(f"{built.ref} {built.pinned} {built.seconds:.0f}s")
            name = built.ref.rsplit(":", 1)[0]
            pin = ImagePin(name=name.rsplit("/", 1)[-1], new_name=name, digest=built.digest)
            print(f"pinned in {write_pin(pin)}")
            if not args.no_push:
                published = publish(podman, built.ref, cosign=not args.no_cosign)
                print(f"signed {published.ref}@{published.digest}")
                print(
                    "verify: HOME="
                    f"{published.trust.home} podman pull --tls-verify=false "
                    f"--signature-policy {published.trust.policy} {published.ref}"
                )
                if published.cosign_public is not None:
                    print(
                        f"verify (cluster form): cosign verify --key {published.cosign_public} "
                        "--insecure-ignore-tlog=true --allow-http-registry "
                        f"--allow-insecure-registry {published.ref}"
                    )
        elif args.command == "llamacpp":
            built = build_llamacpp_image(podman)
            print(f"{built.ref} {built.pinned} {built.seconds:.0f}s")
    except ContainerToolError as exc:
        say(str(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
