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
# The tests run on pytest-xdist workers (--dist loadgroup), one per core (GRAYLANE_TEST_WORKERS=N
# sets how many): the long tests stay one at a time on one worker, as do the tests that share
# something outside the test (podman's images, the PostgreSQL database; see
# tests/conftest.py), and every other test runs beside them; most of a test's time is spent
# waiting on the broker, the engines and the services it starts. 0: every test in this
# process, in order.
WORKERS=${GRAYLANE_TEST_WORKERS:-$(nproc)}
if [ "$WORKERS" = 1 ]; then
  WORKERS=0
fi
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
