"""Prometheus rules (checked and tested with promtool) and their Operator objects.

Room: part of ``deploy``; may import the library and ``deploy``.
"""
