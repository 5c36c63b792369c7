"""Rollout notifications: which decisions are transitions, their webhook bodies and
signatures, and the sender that posts them off the decision path.

Room: a library package. ``transitions.py`` (pure: a decision to a transition),
``webhook.py`` (pure: CloudEvents and Slack bodies, the HMAC signature),
``sender.py`` (the adapter: bounded queues, HTTP with retries, the dead letter).
Imports the library's pure modules; no service.
"""
