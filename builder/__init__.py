"""The builder: ONNX -> validated precision variants and TensorRT engines, with manifests.

Room: an offline job of the service layer. May import the library and itself; no
service, no ``app``.
"""
