"""Kubernetes manifests generated from the registry (``graylane deploy render``).

Room: part of the application layer (``app``): may import everything.
"""
