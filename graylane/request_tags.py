"""The request tags the system sets itself, never a caller.

A request's ``tags`` choose its version by tag rules (:mod:`graylane.routing.table`)
and tell workers how to treat it. Two of them are reserved: the gateway writes them
from the caller's identity and refuses a caller that tries to set them.

====================  =======================================================
``priority``          the caller's priority (:mod:`graylane.priority`), one the
                      caller's API key allows
``tenant``            the tenant the caller's API key belongs to: a tag rule
                      ``tenant=<name>`` matches that tenant's calls only
====================  =======================================================
"""

from __future__ import annotations

from graylane.priority import PRIORITY_TAG

__all__ = ["RESERVED_TAGS", "TENANT_TAG"]

TENANT_TAG = "tenant"
"""The request tag that carries the caller's tenant."""

RESERVED_TAGS: frozenset[str] = frozenset({PRIORITY_TAG, TENANT_TAG})
"""Tags only the gateway sets."""
