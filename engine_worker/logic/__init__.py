"""The worker's pure decisions, one module per idea: no Kafka, no engine, no clock.

Room: ``logic/`` of the worker. May import the standard library, numpy and
``graylane``'s pure library modules (errors, histograms); never the worker's I/O
modules (service, backends, wire) nor Kafka, HTTP or an engine runtime.
"""
