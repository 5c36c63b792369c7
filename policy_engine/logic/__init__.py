"""Pure decision logic of the policy engine: one module per controller or concept.

Nothing here does I/O or imports Kafka, faust, gRPC, SQL or protobuf; the
adapter's ``graylane.policy_engine.wire`` maps these dataclasses to the wire
contracts. Every decision is a function of (state, window stats, ``now_ms``)
and can be replayed (:mod:`graylane.policy_engine.logic.replay`). Import from
the concept's module; this package re-exports nothing.

Room: ``logic/`` of the policy engine. May import the library's pure modules
(rollouts, routing, histograms, errors); never the engine's service, wire or state.
"""
