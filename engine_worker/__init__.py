"""The engine worker: a consumer group per model version, serving it through a backend.

Room: a service package (``service.py`` the loop's hooks and lifecycle, ``wire.py``
protobuf out, used by the outbox alone, ``state.py`` the variant it serves and the cancels
it remembers, ``logic/`` pure decisions: scheduling, batching, admission, sampling,
streaming). Backends (``native.py``, ``engine_server.py``) sit behind ``backend.py``. May
import the library and itself; no other service.
"""
