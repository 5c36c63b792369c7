"""The state the router owns: the newest routing table per model.

Room: ``state.py`` of the router. Keyed by model, changed only through
:meth:`TableStore.offer`, which never goes back to an older epoch (a reader never
applies an older table over a newer one). Read from the compacted
``<p>.control.routing`` topic; rebuilt from it after a restart. No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graylane.routing.table import RouteTable

__all__ = ["TableStore"]


@dataclass
class TableStore:
    """Latest routing table per model; never goes back to an older epoch."""

    tables: dict[str, RouteTable] = field(default_factory=dict)

    def offer(self, table: RouteTable) -> bool:
        current = self.tables.get(table.model)
        if current is not None and table.epoch <= current.epoch:
            return False
        self.tables[table.model] = table
        return True
