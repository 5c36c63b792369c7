"""The one logging set-up of every Graylane process: JSON lines (default) or text for humans.

Each JSON line carries ``time``, ``level``, ``service``, ``logger``, ``message``, the build
(``git_sha``, ``image_version``) and, where the service knows them, ``model``, ``version``,
``variant``, ``rollout_id`` and ``request_id`` (pass them as ``extra=`` or bind them once for
the process with :func:`bind`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from enum import Enum
from typing import IO, Any

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


def _json_formatter() -> logging.Formatter:
    return JsonFormatter(
        "{asctime}{levelname}{name}{message}",
        style="{",
        rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
        datefmt="%Y-%m-%dT%H:%M:%S%z",
        json_ensure_ascii=False,
    )


def configure_logging(
    service: str,
    fmt: LogFormat = LogFormat.JSON,
    *,
    git_sha: str = "unknown",
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
            logging.Formatter(f"%(asctime)s %(levelname)s {service} %(name)s: %(message)s")
        )
    fields = {"service": service, "git_sha": git_sha, "image_version": image_version, **context}
    handler.addFilter(_ProcessFields(fields))
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
