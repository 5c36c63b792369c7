"""The ``graylane`` command line.

Room: part of the application layer (``app``): may import everything; entry points
of every service are here.
"""
