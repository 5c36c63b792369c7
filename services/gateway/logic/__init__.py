"""The gateway's pure decisions: who may call, how fast, how large, how urgent.

Room: ``logic/`` of the gateway. No HTTP, Kafka or protobuf; may import the library's
pure modules (errors, priority). The counters the rules apply to are in
:mod:`~graylane.services.gateway.state`.
"""
