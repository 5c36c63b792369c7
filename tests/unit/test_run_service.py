"""How every service process runs: what it built before serving is out of the
collector's reach while it serves (so full collections stay short)."""

from __future__ import annotations

import asyncio
import gc

from graylane.app.cli.services import run_service


def test_a_service_serves_with_its_start_up_heap_frozen() -> None:
    built = [[i] for i in range(1000)]  # what a service makes before it serves (tracked)
    seen: list[int] = []

    async def main(stop: asyncio.Event) -> None:
        seen.append(gc.get_freeze_count())

    try:
        assert run_service(main) == 0
    finally:
        gc.unfreeze()
    assert seen and seen[0] >= len(built)
