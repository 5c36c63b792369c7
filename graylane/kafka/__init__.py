"""Graylane's Kafka library, one module per concept.

- :mod:`~graylane.kafka.seam`: what services ask of a client (protocols, options) and
  the factory that builds the real ones;
- :mod:`~graylane.kafka.loop`: the one consume loop (guard, backoff, delivery and
  commit, static membership);
- :mod:`~graylane.kafka.reading`: reading a topic to its end, following it, a
  compacted control topic, lag;
- :mod:`~graylane.kafka.replies`: refusing a request (field caps, rejections, error
  results, dead letters);
- :mod:`~graylane.kafka.recovering`: the producer that rebuilds itself after a fatal error;
- :mod:`~graylane.kafka.admin`: topic set-up and ACL grants over the admin API.
"""
