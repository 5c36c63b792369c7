"""The one logging set-up of every Graylane process: JSON lines (default) or text for humans.

Each JSON line carries ``time`` (UTC, milliseconds: ``2026-01-31T10:42:07.123+00:00``),
``level``, ``service``, ``logger``, ``message``, the build (``git_sha``, ``build_time``,
``image_version``),
inside a span its ``trace_id`` and ``span_id`` (:mod:`graylane.tracing`) and, where the
service knows them, ``model``, ``version``, ``variant``, ``rollout_id`` and ``request_id``
(pass them as ``extra=`` or bind them once for the process with :func:`bind`). Text lines
carry the same milliseconds and, inside a span, ``trace=<id>``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import Enum
from typing import IO, Any

from opentelemetry import trace
from pythonjsonlogger.json import JsonFormatter

__all__ = ["CONTEXT_FIELDS", "LogFormat", "bind", "configure_logging"]

CONTEXT_FIELDS = ("model", "version", "variant", "rollout_id", "request_id")
_HANDLER_NAME = "graylane"


class LogFormat(Enum):
    JSON = "json"
    TEXT = "text"


class _ProcessFields(logging.Filter):
    """Adds the process-wide fields (service, build, bound context) to every record."""

    def __init__(self, fields: Mapping[str, str]) -> None:
        super().__init__()
        self.fields = dict(fields)

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in self.fields.items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


class _TraceFields(logging.Filter):
    """Adds the current span's ``trace_id`` / ``span_id`` (and ``trace`` for text lines)."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid and not hasattr(record, "trace_id"):
            record.trace_id = format(ctx.trace_id, "032x")
            record.span_id = format(ctx.span_id, "016x")
        record.trace = f" trace={record.trace_id}" if hasattr(record, "trace_id") else ""
        return True


def _iso_ms(record: logging.LogRecord) -> str:
    return datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds")


class _JsonLines(JsonFormatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return _iso_ms(record)

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        super().add_fields(log_data, record, message_dict)
        log_data.pop("trace", None)  # the text lines' suffix; JSON has trace_id


class _TextLines(logging.Formatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return _iso_ms(record)


def _json_formatter() -> logging.Formatter:
    return _JsonLines(
        "{asctime}{levelname}{name}{message}",
        style="{",
        rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
        json_ensure_ascii=False,
    )


def configure_logging(
    service: str,
    fmt: LogFormat = LogFormat.JSON,
    *,
    git_sha: str = "unknown",
    build_time: str = "unknown",
    image_version: str = "unknown",
    level: int = logging.INFO,
    stream: IO[str] | None = None,
    context: Mapping[str, str] | None = None,
) -> logging.Handler:
    """Route the root logger to one handler on ``stream`` (stderr); replaces an earlier one."""
    context = dict(context or {})
    unknown = set(context) - set(CONTEXT_FIELDS)
    if unknown:
        raise ValueError(f"unknown log context fields: {sorted(unknown)}")
    root = logging.getLogger()
    for old in [h for h in root.handlers if _replaceable(h)]:
        root.removeHandler(old)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.set_name(_HANDLER_NAME)
    if fmt is LogFormat.JSON:
        handler.setFormatter(_json_formatter())
    else:
        handler.setFormatter(
            _TextLines(f"%(asctime)s %(levelname)s {service} %(name)s:%(trace)s %(message)s")
        )
    fields = {
        "service": service,
        "git_sha": git_sha,
        "build_time": build_time,
        "image_version": image_version,
        **context,
    }
    handler.addFilter(_ProcessFields(fields))
    handler.addFilter(_TraceFields())
    root.addHandler(handler)
    root.setLevel(min(level, root.level) if root.level else level)  # keep --verbose's DEBUG
    return handler


def _replaceable(handler: logging.Handler) -> bool:
    """Ours from an earlier call, or a plain console handler (``basicConfig``'s)."""
    return handler.get_name() == _HANDLER_NAME or type(handler) is logging.StreamHandler


def bind(**context: Any) -> None:
    """Add process-wide context (say ``model``/``version`` once a worker knows them)."""
    unknown = set(context) - set(CONTEXT_FIELDS)
    if unknown:
        raise ValueError(f"unknown log context fields: {sorted(unknown)}")
    for handler in logging.getLogger().handlers:
        if handler.get_name() == _HANDLER_NAME:
            for f in handler.filters:
                if isinstance(f, _ProcessFields):
                    f.fields.update({k: str(v) for k, v in context.items()})
