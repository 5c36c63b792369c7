"""Acting on :class:`~graylane.engine_worker.engine_health.EngineHealth`: reload, or give up.

The worker calls :meth:`EngineRecovery.failed` after every batch its engine
failed and :meth:`EngineRecovery.served` after every batch it ran. A reload uses
the worker's own loading code (``reload``: the same variants from the same
artifacts, digests verified again), off the event loop; giving up hands a
:class:`~graylane.engine_worker.engine_health.WorkerGaveUp` to ``give_up``, which
ends the worker once the current cycle is answered and committed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass

from graylane.engine.protocol import InferenceEngine
from graylane.engine_worker.engine_health import EngineHealth, EngineVerdict, WorkerGaveUp

__all__ = ["EngineRecovery", "Reloader"]

log = logging.getLogger(__name__)

Reloader = Callable[[], Mapping[str, InferenceEngine]]
"""Loads the worker's engines again, exactly as at start-up."""


@dataclass
class EngineRecovery:
    health: EngineHealth
    reload: Reloader | None
    give_up: Callable[[BaseException], None]

    def served(self) -> None:
        self.health.served()

    async def failed(self, reason: str, executor: Executor) -> dict[str, InferenceEngine] | None:
        """Note a failed batch; the freshly loaded engines when it is time to reload."""
        verdict = self.health.failed(reason)
        if verdict is EngineVerdict.EXIT:
            exc = self.health.give_up()
            log.critical("%s; the worker stops", exc)
            self.give_up(exc)
            return None
        if verdict is EngineVerdict.CONTINUE:
            return None
        if self.reload is None:
            log.error(
                "engine failed %d consecutive batches (%s); no loader to reload it with",
                self.health.limit,
                reason,
            )
            return None
        log.error(
            "engine failed %d consecutive batches (%s); reloading it", self.health.limit, reason
        )
        try:
            fresh = await asyncio.get_running_loop().run_in_executor(executor, self.reload)
        except Exception as exc:
            gave_up = WorkerGaveUp(f"engine reload failed: {type(exc).__name__}: {exc}")
            log.critical("%s; the worker stops", gave_up)
            self.give_up(gave_up)
            return None
        log.warning("engine reloaded: %s", sorted(fresh))
        return dict(fresh)
