"""The ``graylane`` command line."""
