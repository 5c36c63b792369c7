"""Judging a version by what it answers: evaluation sets, their scores, and comparisons.

An evaluation set (:mod:`~graylane.evaluation.sets`) is a JSONL file of prompts, each
with what its answer must meet; :mod:`~graylane.evaluation.scoring` scores one answer
(pure); :mod:`~graylane.evaluation.summary` turns the scores of a target into a score
with a confidence interval and compares two targets on the same items (pure);
:mod:`~graylane.evaluation.runner` asks a target for the answers: a model version over
Kafka, an engine endpoint, or the gateway (I/O), and an LLM judge where an item asks for
one.

Room: the library. May import the library (the SDK client, the wire contracts); no service.
"""
