"""Inference engines behind one protocol, shared by the worker, the builder and the benches.

ONNX Runtime (``graylane.engine.onnxruntime``) and TensorRT
(``graylane.engine.tensorrt``) adapters are not imported here: importing this
package needs neither runtime.

Room: the library. May import the library; no service.
"""
