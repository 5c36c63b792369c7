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
$BIN/python scripts/typecheck.py || exit 1

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
# GRAYLANE_TEST_WORKERS=N runs the tests on N pytest-xdist workers (--dist loadgroup): the
# long tests stay one at a time on one worker, as do the tests that share something outside
# the test (podman's images, the PostgreSQL database; see tests/conftest.py), and every other
# test runs beside them. Unset or 0: every test in this process, in order. One process is the
# default: the tests that judge real engines' per-token speed need the machine's cores, and
# on two cores the other worker's tests blur the difference they measure.
WORKERS=${GRAYLANE_TEST_WORKERS:-0}
XDIST=()
if [ "$WORKERS" != 0 ]; then
  XDIST=(-n "$WORKERS" --dist loadgroup)
fi
# The slowest tests, every run: where the suite's time goes.
$BIN/python -m pytest ${XDIST[@]+"${XDIST[@]}"} --durations=30 "$@"
rc=$?

echo "==> stopping the local services"
$BIN/python deploy/postgres/postgres.py stop || true
$BIN/python deploy/kafka/kafka.py stop || true
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here"
  exit 1
fi
exit "$rc"
