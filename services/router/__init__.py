"""The router: ingress topic -> per-version topics, by the newest routing table.

Room: a service package (``service.py`` lifecycle and loop hooks, ``wire.py`` protobuf,
``state.py`` the newest table per model, ``logic/`` what it refuses). May import the
library and itself; no other service.
"""
