"""Models Graylane generates itself (no downloads): the seeded demo GPT.

Room: the library. May import the library; no service.
"""
