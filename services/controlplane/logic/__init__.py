"""The control plane's pure decisions: what may start, which command fits which rollout.

Room: ``logic/`` of the control plane. No gRPC, SQL, Kafka or protobuf: the servicers
gather the facts into plain dataclasses and map the typed errors to status codes at the
edge (:mod:`~graylane.services.controlplane.servicers`). May import the library's domain
modules (errors, rollouts, artifacts naming) only.
"""
