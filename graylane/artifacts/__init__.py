"""Artifacts: the naming rule, manifests, sha256 verification and engine compatibility.

Room: the library. May import the library; no service.
"""
