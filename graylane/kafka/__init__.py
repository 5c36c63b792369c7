"""Graylane's Kafka library, one module per concept.

- :mod:`~graylane.kafka.seam`: what services ask of a client (protocols, options) and
  the factory that builds the real ones;
- :mod:`~graylane.kafka.consume_loop`: the one consume loop (fetch -> handle -> deliver
  -> commit) and the hooks a service gives it; beneath it, one module each:
  :mod:`~graylane.kafka.guard` (fault counts, the batch in flight, rebalances),
  :mod:`~graylane.kafka.delivery` (acknowledged sends, then the commit),
  :mod:`~graylane.kafka.in_flight` (the pipelined loop's cycles),
  :mod:`~graylane.kafka.fault` (what kind of event an error is),
  :mod:`~graylane.kafka.backoff` and :mod:`~graylane.kafka.membership` (static group
  member ids);
- :mod:`~graylane.kafka.reading`: reading a topic to its end, following it, a
  compacted control topic, lag;
- :mod:`~graylane.kafka.replies`: refusing a request (field caps, rejections, error
  results, dead letters);
- :mod:`~graylane.kafka.recovering`: the producer that rebuilds itself after a fatal error;
- :mod:`~graylane.kafka.admin`: topic set-up and ACL grants over the admin API.

Room: the library's Kafka layer. May import the rest of the library; no service.
"""
