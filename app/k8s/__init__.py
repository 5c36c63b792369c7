"""Kubernetes manifests generated from the registry (``graylane deploy render``)."""
