"""A local PostgreSQL server for the registry tests, without Docker.

Room: part of ``deploy``; may import the library and ``deploy``.
"""
