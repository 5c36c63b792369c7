"""Local LLM engine servers for tests, the demo and benchmarks (see ``llamacpp.py``)."""
