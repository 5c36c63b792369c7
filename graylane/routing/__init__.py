"""Pure routing: the traffic split, sticky buckets, monotone ranges, rules, pins, shadow.

Room: the library, pure. May import the library's pure modules; no Kafka, no service.
"""
