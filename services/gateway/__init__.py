"""The HTTP gateway: OpenAI API and Open Inference Protocol v2 in front of the ingress.

Room: a service package (``service.py`` the HTTP app and its lifecycle, ``wire.py`` and
``oip.py`` HTTP JSON and protobuf, ``state.py`` buckets and calls in flight, ``logic/``
admission rules). May import the library and itself; no other service.
"""
