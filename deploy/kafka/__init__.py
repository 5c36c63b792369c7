"""A local Apache Kafka broker (KRaft) without Docker: download, configure, start, stop.

Room: part of ``deploy``; may import the library and ``deploy``.
"""
