"""The control plane: gRPC API over the registry, rollouts, QoS policies and the audit.

Room: a service package (``service.py`` the gRPC process, ``wire.py`` protobuf answers,
``state.py`` its SQL store, ``logic/`` the pure rules; the audit sink beside them). May
import the library and itself; no other service.
"""
