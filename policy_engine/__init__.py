"""The policy engine: telemetry in, routing, precision, replicas and audit out.

Room: a service package (``service.py`` the faust-streaming adapter, ``wire.py``
protobuf in and out, ``state.py`` what it owns, ``core.py`` the I/O-free orchestrator,
``logic/`` the pure controllers). May import the library and itself; no other service.
"""
