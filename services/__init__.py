"""The services of the data and control path, one package each: ``router``, ``gateway``,
``controlplane`` (the worker and the policy engine are top-level packages of their own).

Room: the service layer. Every service package has the same rooms (``service.py``,
``wire.py``, ``state.py``, ``logic/``; see ``ARCHITECTURE.md``). May import the library
(``graylane.*`` below the services) and itself; never another service, never ``app``.
"""
