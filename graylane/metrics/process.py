"""One observability set-up per service process: registry, build info, readiness, HTTP port."""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from graylane.metrics.http import (
    MetricsAddress,
    ObservabilityServer,
    Readiness,
    serve_observability,
)
from graylane.metrics.units import build_info

__all__ = [
    "CONTROL_CAUGHT_UP",
    "GROUP_JOINED",
    "BuildLabels",
    "ServiceObservability",
]

log = logging.getLogger(__name__)

GROUP_JOINED = "group_joined"
"""The service's consumer has partitions assigned."""
CONTROL_CAUGHT_UP = "control_caught_up"
"""The service has read its control topics (routing, precision, rollouts) to their end."""


@dataclass(frozen=True, kw_only=True)
class BuildLabels:
    """What ``graylane_build_info`` and every log line say about the running build."""

    version: str = "unknown"
    git_sha: str = "unknown"


@dataclass
class ServiceObservability:
    """The registry a service's metrics live in, and the port that serves them once started."""

    service: str
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    readiness: Readiness = field(
        default_factory=lambda: Readiness((GROUP_JOINED, CONTROL_CAUGHT_UP))
    )
    server: ObservabilityServer | None = None

    def start(self, address: MetricsAddress | None, build: BuildLabels) -> int:
        """Export build info and serve; the bound port (0 when ``address`` is None = off)."""
        if self.server is not None:
            return self.server.port
        build_info(
            self.registry, service=self.service, version=build.version, git_sha=build.git_sha
        )
        if address is None:
            return 0
        self.server = serve_observability(self.registry, address, self.readiness)
        log.info(
            "%s metrics on http://%s:%d/metrics (/healthz, /readyz)",
            self.service,
            address.host,
            self.server.port,
        )
        return self.server.port

    @property
    def port(self) -> int:
        return 0 if self.server is None else self.server.port

    def mark(self, condition: str, met: bool = True) -> None:
        self.readiness.mark(condition, met)

    def note_assignment(self, assigned: Collection[object]) -> None:
        """Ready on ``group_joined`` while the consumer holds partitions."""
        self.readiness.mark(GROUP_JOINED, bool(assigned))

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
