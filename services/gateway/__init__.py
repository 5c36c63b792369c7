"""The HTTP gateway: OpenAI API and Open Inference Protocol v2 in front of the ingress.

Room: a service package (``service.py`` the HTTP app and its lifecycle, ``front_door.py``
its route table and the door that admits keyed calls from their headers, ``wire.py`` and
``oip.py`` HTTP JSON and protobuf, ``state.py`` buckets and calls in flight, ``logic/``
admission rules). May import the library and itself; no other service.
"""
