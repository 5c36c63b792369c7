"""Local LLM engine servers for tests, the demo and benchmarks (see ``llamacpp.py``).

Room: part of ``deploy``; may import the library and ``deploy``.
"""
