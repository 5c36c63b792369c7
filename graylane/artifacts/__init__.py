"""Artifacts: the naming rule, manifests, sha256 verification and engine compatibility."""
