"""Container images built and run with podman (``make images``, the kube-play tests).

Room: part of ``deploy``; may import the library and ``deploy``.
"""
