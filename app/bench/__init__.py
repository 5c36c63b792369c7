"""Benchmarks: scripts that print their figures (``graylane bench ...``), not timed tests.

Room: part of the application layer (``app``): may import everything. Their own
dependencies are the ``bench`` extra (``confluent-kafka``), imported when one runs;
shared harness code lives once, in ``harness.py``.
"""
