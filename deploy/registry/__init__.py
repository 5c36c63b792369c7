"""A local OCI registry (the CNCF distribution registry built from its Go module) on loopback.

Room: part of ``deploy``; may import the library and ``deploy``.
"""
