"""The application layer: the graylane CLI, the demo, the benchmarks and the local stack
supervisor. The only code that may import every other layer.

Room: the application layer, top of the house.
"""
