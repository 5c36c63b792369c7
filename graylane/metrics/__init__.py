"""Prometheus metrics of every Graylane service (one registry and one port per process).

Catalogue: :mod:`graylane.metrics.dataplane` (gateway, router, worker),
:mod:`graylane.metrics.controlside` (policy engine, control plane, audit sink),
:mod:`graylane.metrics.gpu` (NVML), and ``graylane_build_info`` in
:mod:`graylane.metrics.units`. :func:`serve_observability` (in
:mod:`graylane.metrics.process`) serves ``/metrics``, ``/healthz`` and ``/readyz`` on one
address.

Room: the library. May import the library; no service.
"""
