"""The rollout domain shared by the policy engine, control plane, CLI and benchmarks.

:mod:`~graylane.rollouts.vocabulary` (phases, manual commands, decision kinds and
rules), :mod:`~graylane.rollouts.spec` (what a rollout should do),
:mod:`~graylane.rollouts.qos_policy`, :mod:`~graylane.rollouts.errors` and their
protobuf mappings in :mod:`~graylane.rollouts.pb`. Pure data and rules: no I/O.

Room: the library. May import the library's pure modules; no service.
"""
