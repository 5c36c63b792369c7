"""Gather registry and store facts for the domain checks, and registry views for the API."""

from __future__ import annotations

from graylane.registry import ArtifactInfo, ModelNotRegistered, Registry
from graylane.rollouts.pb import phase_from_pb
from graylane.services.controlplane import domain
from graylane.services.controlplane.store import ControlStore
from graylane.v1 import controlplane_pb2

__all__ = ["model_facts", "variant_info", "version_summary"]


def model_facts(registry: Registry, store: ControlStore, name: str) -> domain.ModelFacts | None:
    """None when the model is not registered."""
    if not name:
        return None
    try:
        info = registry.get_model(name)
    except ModelNotRegistered:
        return None
    versions: dict[str, domain.VersionFacts] = {}
    for v in registry.list_versions(name):
        artifacts = tuple(
            domain.ArtifactFacts(
                name=str(a.name),
                precision=a.precision.value,
                servable=a.servable,
                failures=a.validation.failures if a.validation is not None else (),
            )
            for a in registry.list_artifacts(name, v.version)
        )
        versions[str(v.version)] = domain.VersionFacts(str(v.version), v.status.value, artifacts)
    active = store.active_rollout(name)
    return domain.ModelFacts(
        name=info.name,
        versions=versions,
        stable_version=str(info.stable_version) if info.stable_version else None,
        active_rollout_id=active.state.rollout_id if active else None,
        active_rollout_phase=phase_from_pb(active.state.phase) if active else None,
    )


def variant_info(a: ArtifactInfo) -> controlplane_pb2.VariantInfo:
    out = controlplane_pb2.VariantInfo(
        artifact=str(a.name),
        precision=a.precision.value,
        backend=a.backend.value,
        target=a.target,
        servable=a.servable,
        forced=a.forced,
    )
    v = a.validation
    if v is not None:
        out.validation.CopyFrom(
            controlplane_pb2.ValidationStatus(
                validated=True,
                passed=v.passed,
                max_abs=v.max_abs or 0.0,
                mean_rel=v.mean_rel or 0.0,
                cosine=v.cosine or 0.0,
                top1_agreement=v.top1_agreement or 0.0,
                token_agreement=v.token_agreement or 0.0,
                failures=list(v.failures),
            )
        )
    return out


def version_summary(
    registry: Registry, model: str, version: str
) -> controlplane_pb2.VersionSummary:
    info = registry.get_version(model, version)
    stable = registry.get_stable(model)
    return controlplane_pb2.VersionSummary(
        model=model,
        version=str(info.version),
        status=info.status.value,
        source_sha256=info.source_sha256,
        created_at_unix_ms=int(info.created_at.timestamp() * 1000),
        stable=stable is not None and stable.version == info.version,
        variants=[variant_info(a) for a in registry.list_artifacts(model, info.version)],
    )
