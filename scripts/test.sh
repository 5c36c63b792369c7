#!/usr/bin/env bash
# Runs the whole test suite: static checks, then pytest against a real local
# Kafka broker and a real PostgreSQL server, both started here and stopped after,
# and a real llama.cpp engine server (built once per machine; tests start their own).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin

echo "==> generated protobuf code is up to date"
$BIN/python protos/generate.py --check || exit 1

echo "==> lint (ruff) and types (mypy)"
$BIN/ruff check . || exit 1
$BIN/mypy || exit 1

echo "==> Prometheus rules (promtool check rules, promtool test rules)"
$BIN/python deploy/prometheus/prometheus.py check || exit 1

echo "==> Prometheus Operator objects generated from the rules are up to date"
$BIN/python deploy/prometheus/operator_objects.py check || exit 1

echo "==> the llama.cpp engine server and its model (built once per machine, then cached)"
$BIN/python deploy/engines/llamacpp.py setup || exit 1

echo "==> starting the local Kafka broker and PostgreSQL"
$BIN/python deploy/kafka/kafka.py start || exit 1
$BIN/python deploy/postgres/postgres.py start || { $BIN/python deploy/kafka/kafka.py stop; exit 1; }

echo "==> pytest"
# In parallel (pytest-xdist): one worker runs the long tests one after another, as before,
# while the other takes the rest (most of them wait on the broker, not on a core); tests that
# share something outside the test are grouped onto one worker (tests/conftest.py).
# GRAYLANE_TEST_WORKERS=0 runs them all in this process, in order.
# The slowest tests, every run: where the suite's time goes.
$BIN/python -m pytest -n "${GRAYLANE_TEST_WORKERS:-2}" --dist loadgroup --durations=30 "$@"
rc=$?

echo "==> stopping the local services"
$BIN/python deploy/postgres/postgres.py stop || true
$BIN/python deploy/kafka/kafka.py stop || true
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here"
  exit 1
fi
exit "$rc"
