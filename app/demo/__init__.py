"""The demo: builds versions of the seeded demo GPT and tells the rollout / QoS story.

Room: part of the application layer (``app``): may import everything.
"""
