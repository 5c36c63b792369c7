"""gRPC ``ModelRegistry``: register models and versions, list them, set the stable version."""

from __future__ import annotations

import asyncio

from graylane.services.controlplane.facts import version_summary
from graylane.services.controlplane.plane import Context, ControlPlane, mapped
from graylane.v1 import controlplane_pb2, controlplane_pb2_grpc

__all__ = ["ModelRegistryServicer"]


def _model_summary(cp: ControlPlane, name: str) -> controlplane_pb2.ModelSummary:
    info = cp.registry.get_model(name)
    return controlplane_pb2.ModelSummary(
        name=info.name,
        description=info.description,
        stable_version=str(info.stable_version) if info.stable_version else "",
        created_at_unix_ms=int(info.created_at.timestamp() * 1000),
    )


class ModelRegistryServicer(controlplane_pb2_grpc.ModelRegistryServicer):
    def __init__(self, cp: ControlPlane) -> None:
        self._cp = cp

    @mapped
    async def RegisterModel(
        self, request: controlplane_pb2.RegisterModelRequest, context: Context
    ) -> controlplane_pb2.ModelSummary:
        await asyncio.to_thread(self._cp.registry.register_model, request.name, request.description)
        return await asyncio.to_thread(_model_summary, self._cp, request.name)

    @mapped
    async def ListModels(
        self, request: controlplane_pb2.ListModelsRequest, context: Context
    ) -> controlplane_pb2.ListModelsResponse:
        models = await asyncio.to_thread(self._cp.registry.list_models)
        return controlplane_pb2.ListModelsResponse(
            models=[
                controlplane_pb2.ModelSummary(
                    name=m.name,
                    description=m.description,
                    stable_version=str(m.stable_version) if m.stable_version else "",
                    created_at_unix_ms=int(m.created_at.timestamp() * 1000),
                )
                for m in models
            ]
        )

    @mapped
    async def RegisterVersion(
        self, request: controlplane_pb2.RegisterVersionRequest, context: Context
    ) -> controlplane_pb2.VersionSummary:
        reg = self._cp.registry
        await asyncio.to_thread(
            reg.register_version, request.model, request.version, request.source_sha256
        )
        return await asyncio.to_thread(version_summary, reg, request.model, request.version)

    @mapped
    async def ListVersions(
        self, request: controlplane_pb2.ListVersionsRequest, context: Context
    ) -> controlplane_pb2.ListVersionsResponse:
        reg = self._cp.registry

        def load() -> controlplane_pb2.ListVersionsResponse:
            model = _model_summary(self._cp, request.model)
            versions = [
                version_summary(reg, request.model, str(v.version))
                for v in reg.list_versions(request.model)
            ]
            return controlplane_pb2.ListVersionsResponse(model=model, versions=versions)

        return await asyncio.to_thread(load)

    @mapped
    async def SetStable(
        self, request: controlplane_pb2.SetStableRequest, context: Context
    ) -> controlplane_pb2.VersionSummary:
        reg = self._cp.registry
        await asyncio.to_thread(reg.set_stable, request.model, request.version)
        return await asyncio.to_thread(version_summary, reg, request.model, request.version)
