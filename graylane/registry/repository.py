"""The model registry over a SQLAlchemy engine: models, versions, artifacts, stable version.

The errors and the dataclasses it returns are in :mod:`graylane.registry.records`.
Every method opens its own short transaction and returns frozen dataclasses, never
ORM objects, so callers cannot lazy-load or mutate rows by accident.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy import Engine, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload, sessionmaker

from graylane.artifacts.naming import (
    Backend,
    NamingError,
    Precision,
    SemVer,
    parse_artifact_name,
    parse_semver,
    validate_model_name,
    validate_version_name,
)
from graylane.registry.migrate import create_db_engine, require_current, upgrade
from graylane.registry.records import (
    ArtifactInfo,
    ArtifactRecord,
    DuplicateArtifact,
    DuplicateVersion,
    EndpointSummary,
    ModelNotRegistered,
    RegisteredModel,
    RegistryError,
    RungQuality,
    StableRevision,
    UnknownArtifact,
    UnknownVersion,
    ValidationSummary,
    VersionInfo,
    VersionStatus,
    target_for,
)
from graylane.registry.schema import (
    ArtifactRow,
    ModelRow,
    ModelVersionRow,
    RungQualityRow,
    StableRevisionRow,
    StableVersionRow,
    ValidationResultRow,
)

__all__ = ["Registry"]


def _semver(version: SemVer | str) -> SemVer:
    try:
        return version if isinstance(version, SemVer) else parse_semver(version)
    except NamingError as exc:
        raise RegistryError(str(exc)) from None


def _new_semver(version: SemVer | str) -> SemVer:
    """A version to register: semantic, and able to name its topic (no build metadata)."""
    semver = _semver(version)
    try:
        validate_version_name(str(semver))
    except NamingError as exc:
        raise RegistryError(str(exc)) from None
    return semver


def _utc(moment: datetime) -> datetime:
    # SQLite hands timestamps back without a zone; they were written in UTC.
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _version_info(row: ModelVersionRow, model: str) -> VersionInfo:
    return VersionInfo(
        model=model,
        version=parse_semver(row.version),
        source_sha256=row.source_sha256,
        status=VersionStatus(row.status),
        created_at=_utc(row.created_at),
    )


def _validation(row: ValidationResultRow | None) -> ValidationSummary | None:
    if row is None:
        return None
    return ValidationSummary(
        passed=row.passed,
        max_abs=row.max_abs,
        mean_rel=row.mean_rel,
        cosine=row.cosine,
        top1_agreement=row.top1_agreement,
        token_agreement=row.token_agreement,
        rows=row.rows,
        failures=tuple(line for line in row.failures.splitlines() if line),
    )


def _artifact_info(row: ArtifactRow) -> ArtifactInfo:
    return ArtifactInfo(
        name=parse_artifact_name(row.name),
        target=row.target,
        path=row.path,
        manifest_sha256=row.manifest_sha256,
        servable=row.servable,
        forced=row.forced,
        gpu_compute_capability=row.gpu_compute_capability,
        validation=_validation(row.validation),
        created_at=_utc(row.created_at),
        endpoint=None
        if row.endpoint_url is None
        else EndpointSummary(row.endpoint_url, row.model_sha256, row.ladder_rank or 0),
    )


def _rung_quality(row: RungQualityRow) -> RungQuality:
    return RungQuality(
        precision=Precision(row.precision),
        set_name=row.set_name,
        set_sha256=row.set_sha256,
        items=row.items,
        score=row.score,
        ci_low=row.ci_low,
        ci_high=row.ci_high,
        reference_precision=Precision(row.reference_precision),
        reference_score=row.reference_score,
        recorded_at=_utc(row.recorded_at),
    )


class Registry:
    """Model registry backed by any SQLAlchemy engine (SQLite file or PostgreSQL)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @property
    def engine(self) -> Engine:
        return self._engine

    # ------------------------------------------------------------ lookups

    @staticmethod
    def _model(session: Session, name: str) -> ModelRow:
        row = session.scalar(select(ModelRow).where(ModelRow.name == name))
        if row is None:
            raise ModelNotRegistered(f"model {name!r} is not registered")
        return row

    @staticmethod
    def _version(session: Session, model: ModelRow, version: SemVer) -> ModelVersionRow:
        row = session.scalar(
            select(ModelVersionRow).where(
                ModelVersionRow.model_id == model.id, ModelVersionRow.version == str(version)
            )
        )
        if row is None:
            raise UnknownVersion(f"model {model.name!r} has no version {version}")
        return row

    # ------------------------------------------------------------ models

    def register_model(self, name: str, description: str = "") -> RegisteredModel:
        """Register ``name``, or return it unchanged when it is already registered."""
        try:
            validate_model_name(name)
        except NamingError as exc:
            raise RegistryError(str(exc)) from None
        with self._sessions.begin() as session:
            row = session.scalar(select(ModelRow).where(ModelRow.name == name))
            if row is None:
                row = ModelRow(name=name, description=description)
                session.add(row)
                session.flush()
            return RegisteredModel(
                row.name, row.description, _utc(row.created_at), self._stable(session, row)
            )

    def get_model(self, name: str) -> RegisteredModel:
        with self._sessions() as session:
            row = self._model(session, name)
            return RegisteredModel(
                row.name, row.description, _utc(row.created_at), self._stable(session, row)
            )

    def list_models(self) -> list[RegisteredModel]:
        with self._sessions() as session:
            rows = session.scalars(select(ModelRow).order_by(ModelRow.name)).all()
            return [
                RegisteredModel(r.name, r.description, _utc(r.created_at), self._stable(session, r))
                for r in rows
            ]

    # ------------------------------------------------------------ versions

    def register_version(
        self,
        model: str,
        version: SemVer | str,
        source_sha256: str,
        status: VersionStatus = VersionStatus.REGISTERED,
    ) -> VersionInfo:
        semver = _new_semver(version)
        try:
            with self._sessions.begin() as session:
                model_row = self._model(session, model)
                existing = session.scalar(
                    select(ModelVersionRow).where(
                        ModelVersionRow.model_id == model_row.id,
                        ModelVersionRow.version == str(semver),
                    )
                )
                if existing is not None:
                    raise DuplicateVersion(
                        f"{model} {semver} is already registered (source sha256 "
                        f"{existing.source_sha256[:12]}…); bump the version"
                    )
                row = ModelVersionRow(
                    model_id=model_row.id,
                    version=str(semver),
                    source_sha256=source_sha256,
                    status=status.value,
                )
                session.add(row)
                session.flush()
                return _version_info(row, model)
        except IntegrityError:
            # Another writer registered it between our check and our insert.
            raise DuplicateVersion(f"{model} {semver} is already registered") from None

    def get_version(self, model: str, version: SemVer | str) -> VersionInfo:
        semver = _semver(version)
        with self._sessions() as session:
            return _version_info(self._version(session, self._model(session, model), semver), model)

    def set_version_status(
        self, model: str, version: SemVer | str, status: VersionStatus
    ) -> VersionInfo:
        semver = _semver(version)
        with self._sessions.begin() as session:
            row = self._version(session, self._model(session, model), semver)
            row.status = status.value
            return _version_info(row, model)

    def list_versions(self, model: str) -> list[VersionInfo]:
        """All versions of ``model``, lowest semver precedence first."""
        with self._sessions() as session:
            model_row = self._model(session, model)
            rows = session.scalars(
                select(ModelVersionRow).where(ModelVersionRow.model_id == model_row.id)
            ).all()
            infos = [_version_info(r, model) for r in rows]
        return sorted(infos, key=lambda v: v.version)

    # ------------------------------------------------------------ artifacts

    def add_artifact(self, record: ArtifactRecord, *, replace: bool = False) -> ArtifactInfo:
        """Register a published artifact under its model version (which must exist).

        With ``replace`` an artifact of the same name and GPU target is overwritten
        (a forced rebuild); otherwise that is a :class:`DuplicateArtifact`.
        """
        name = record.name
        target = target_for(record.gpu_compute_capability)
        try:
            with self._sessions.begin() as session:
                version_row = self._version(session, self._model(session, name.model), name.version)
                existing = session.scalar(
                    select(ArtifactRow).where(
                        ArtifactRow.name == str(name), ArtifactRow.target == target
                    )
                )
                if existing is not None:
                    if not replace:
                        raise DuplicateArtifact(
                            f"artifact {name} ({target}) is already registered; pass --force "
                            "to replace it"
                        )
                    session.delete(existing)
                    session.flush()
                row = ArtifactRow(
                    version_id=version_row.id,
                    name=str(name),
                    target=target,
                    precision=name.precision.value,
                    backend=name.backend.value,
                    backend_version=name.backend_version,
                    strategy=name.strategy,
                    path=record.path,
                    manifest_sha256=record.manifest_sha256,
                    servable=record.servable,
                    forced=record.forced,
                    gpu_compute_capability=record.gpu_compute_capability,
                )
                if record.endpoint is not None:
                    row.endpoint_url = record.endpoint.url
                    row.model_sha256 = record.endpoint.model_sha256
                    row.ladder_rank = record.endpoint.ladder_rank
                if record.validation is not None:
                    v = record.validation
                    row.validation = ValidationResultRow(
                        passed=v.passed,
                        max_abs=v.max_abs,
                        mean_rel=v.mean_rel,
                        cosine=v.cosine,
                        top1_agreement=v.top1_agreement,
                        token_agreement=v.token_agreement,
                        rows=v.rows,
                        failures="\n".join(v.failures),
                    )
                session.add(row)
                session.flush()
                return _artifact_info(row)
        except IntegrityError:
            raise DuplicateArtifact(f"artifact {name} ({target}) is already registered") from None

    def _artifact_rows(
        self, session: Session, model: str, version: SemVer
    ) -> Sequence[ArtifactRow]:
        """By name and target; engine endpoints after the others, in ladder order."""
        version_row = self._version(session, self._model(session, model), version)
        rows = session.scalars(
            select(ArtifactRow)
            .where(ArtifactRow.version_id == version_row.id)
            .options(selectinload(ArtifactRow.validation))
            .order_by(ArtifactRow.name, ArtifactRow.target)
        ).all()
        # Sorted here: databases disagree on where NULLs sort.
        return sorted(rows, key=lambda r: (r.ladder_rank is not None, r.ladder_rank or 0))

    def list_artifacts(self, model: str, version: SemVer | str) -> list[ArtifactInfo]:
        """A version's artifacts by name; engine endpoints last, best rung first."""
        semver = _semver(version)
        with self._sessions() as session:
            return [_artifact_info(r) for r in self._artifact_rows(session, model, semver)]

    def get_artifact(
        self,
        model: str,
        version: SemVer | str,
        precision: Precision,
        backend: Backend,
        compute_capability: str | None = None,
        strategy: str | None = None,
    ) -> ArtifactInfo:
        """The artifact of that precision and backend; for engines, of that GPU target.

        When several match (several strategies, or engines for several GPUs and no
        ``compute_capability`` given), the servable one registered last wins.
        """
        semver = _semver(version)
        with self._sessions() as session:
            rows = [
                r
                for r in self._artifact_rows(session, model, semver)
                if r.precision == precision.value
                and r.backend == backend.value
                and (strategy is None or r.strategy == strategy)
                and (compute_capability is None or r.target == target_for(compute_capability))
            ]
            if not rows:
                where = (
                    f" for compute capability {compute_capability}" if compute_capability else ""
                )
                raise UnknownArtifact(
                    f"no {precision.value} {backend.value} artifact of {model} {semver}{where}"
                )
            rows.sort(key=lambda r: (r.servable, r.created_at, r.id))
            return _artifact_info(rows[-1])

    # ------------------------------------------------------------ rung quality

    def record_rung_quality(
        self, model: str, version: SemVer | str, records: Sequence[RungQuality]
    ) -> list[RungQuality]:
        """Store each rung's score on its set (replacing an earlier one of the same rung
        on the same set digest), in one transaction."""
        semver = _semver(version)
        stored: list[RungQuality] = []
        with self._sessions.begin() as session:
            version_row = self._version(session, self._model(session, model), semver)
            for record in records:
                row = session.scalar(
                    select(RungQualityRow).where(
                        RungQualityRow.version_id == version_row.id,
                        RungQualityRow.precision == record.precision.value,
                        RungQualityRow.set_sha256 == record.set_sha256,
                    )
                )
                if row is None:
                    row = RungQualityRow(
                        version_id=version_row.id,
                        precision=record.precision.value,
                        set_sha256=record.set_sha256,
                    )
                    session.add(row)
                row.set_name = record.set_name
                row.items = record.items
                row.score = record.score
                row.ci_low = record.ci_low
                row.ci_high = record.ci_high
                row.reference_precision = record.reference_precision.value
                row.reference_score = record.reference_score
                row.recorded_at = datetime.now(UTC)
                session.flush()
                stored.append(_rung_quality(row))
        return stored

    def rung_quality(self, model: str, version: SemVer | str) -> dict[Precision, RungQuality]:
        """The newest measurement of each rung of a version (any set)."""
        semver = _semver(version)
        with self._sessions() as session:
            version_row = self._version(session, self._model(session, model), semver)
            rows = session.scalars(
                select(RungQualityRow).where(RungQualityRow.version_id == version_row.id)
            ).all()
            newest: dict[Precision, RungQuality] = {}
            for row in sorted(rows, key=lambda r: (_utc(r.recorded_at), r.id)):
                record = _rung_quality(row)
                newest[record.precision] = record
            return newest

    # ------------------------------------------------------------ stable version

    @staticmethod
    def _stable(session: Session, model: ModelRow) -> SemVer | None:
        row = session.get(StableVersionRow, model.id)
        if row is None:
            return None
        version = session.get(ModelVersionRow, row.version_id)
        return None if version is None else parse_semver(version.version)

    def set_stable(self, model: str, version: SemVer | str) -> VersionInfo:
        semver = _semver(version)
        with self._sessions.begin() as session:
            model_row = self._model(session, model)
            version_row = self._version(session, model_row, semver)
            stable = session.get(StableVersionRow, model_row.id)
            changed = stable is None or stable.version_id != version_row.id
            if stable is None:
                session.add(StableVersionRow(model_id=model_row.id, version_id=version_row.id))
            elif changed:
                stable.previous_version_id = stable.version_id
                stable.version_id = version_row.id
            if changed:
                last = session.scalar(
                    select(func.max(StableRevisionRow.revision)).where(
                        StableRevisionRow.model_id == model_row.id
                    )
                )
                session.add(
                    StableRevisionRow(
                        model_id=model_row.id, revision=(last or 0) + 1, version=str(semver)
                    )
                )
            return _version_info(version_row, model)

    def stable_revisions(self, model: str, limit: int = 10) -> list[StableRevision]:
        """The model's last ``limit`` stable versions, newest first (revision numbers)."""
        with self._sessions() as session:
            model_row = self._model(session, model)
            rows = session.scalars(
                select(StableRevisionRow)
                .where(StableRevisionRow.model_id == model_row.id)
                .order_by(StableRevisionRow.revision.desc())
                .limit(limit)
            ).all()
            return [
                StableRevision(model, r.revision, parse_semver(r.version), _utc(r.set_at))
                for r in rows
            ]

    def get_previous_stable(self, model: str) -> VersionInfo | None:
        """The stable version before the current one (None when it never changed)."""
        with self._sessions() as session:
            model_row = self._model(session, model)
            stable = session.get(StableVersionRow, model_row.id)
            if stable is None or stable.previous_version_id is None:
                return None
            row = session.get(ModelVersionRow, stable.previous_version_id)
            return None if row is None else _version_info(row, model)

    def get_stable(self, model: str) -> VersionInfo | None:
        with self._sessions() as session:
            model_row = self._model(session, model)
            stable = session.get(StableVersionRow, model_row.id)
            if stable is None:
                return None
            row = session.get(ModelVersionRow, stable.version_id)
            return None if row is None else _version_info(row, model)


def open_registry(url: str, migrate: bool = True, *, read_only: bool = False) -> Registry:
    """A :class:`Registry` on ``url``, with the schema migrated to the latest revision.

    ``read_only`` (a worker): no migration, every write refused by the connection, and
    :class:`~graylane.registry.migrate.SchemaNotCurrent` unless someone migrated the schema
    already.
    """
    engine = create_db_engine(url, read_only=read_only)
    if read_only:
        require_current(engine)
    elif migrate:
        upgrade(engine)
    return Registry(engine)
