"""The router's pure decisions, one module per idea: no Kafka, no protobuf, no clock.

Room: ``logic/`` of the router. The routing decision itself is the library's pure
:func:`graylane.routing.route`; here is what the router decides on its own: which
ingress requests it refuses (:mod:`~graylane.services.router.logic.intake`). May import
the library's pure modules (errors, routing); never the router's service or wire.
"""
