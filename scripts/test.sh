#!/usr/bin/env bash
# Runs the whole test suite: static checks, then pytest against a real local
# Kafka broker and a real PostgreSQL server, both started here and stopped after,
# and a real llama.cpp engine server (built once per machine; tests start their own).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin

echo "==> free disk space (the suite writes up to a few gigabytes: builds, images, the broker's logs)"
NEED_GB=${GRAYLANE_TEST_MIN_FREE_GB:-3}
for where in . "${TMPDIR:-/tmp}"; do
  free_kb=$(df -Pk "$where" | awk 'NR == 2 {print $4}')
  echo "    $where: $((free_kb / 1024 / 1024)) GB free"
  if [ "$free_kb" -lt $((NEED_GB * 1024 * 1024)) ]; then
    echo "only $((free_kb / 1024)) MB free under $where, and the tests need about $NEED_GB GB:" \
      "a full disk stops the broker and fails every test after it. Free some space" \
      "(old pytest-of-* folders in the temp dir, old clones) or set GRAYLANE_TEST_MIN_FREE_GB."
    exit 1
  fi
done

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
# Two phases on GRAYLANE_TEST_WORKERS pytest-xdist workers (default 2; 0: one process, in order):
# 1. the tests marked ``speed``, alone in one process: they judge real engines' per-token time
#    and load spikes, and another test beside them on the same cores would blur what they measure;
# 2. every other test on the workers (--dist loadgroup): the tests that share something outside
#    the test (podman's images, the PostgreSQL database) stay one at a time on one worker (see
#    tests/conftest.py); every other test has its own topics, groups, ports and files.
# Arguments (paths, -k, -m) make it one run of those tests. Each run prints its slowest tests.
WORKERS=${GRAYLANE_TEST_WORKERS:-2}
XDIST=()
if [ "$WORKERS" != 0 ]; then
  XDIST=(-n "$WORKERS" --dist loadgroup)
fi
if [ "$#" -gt 0 ] || [ "$WORKERS" = 0 ]; then
  $BIN/python -m pytest ${XDIST[@]+"${XDIST[@]}"} --durations=30 "$@"
  rc=$?
else
  echo "==> pytest, phase 1 of 2: the tests that judge measured speed, alone (at ${SECONDS} s)"
  $BIN/python -m pytest -m speed --durations=10
  rc=$?
  echo "==> pytest, phase 2 of 2: every other test on $WORKERS workers (at ${SECONDS} s)"
  $BIN/python -m pytest -m "not speed" "${XDIST[@]}" --durations=30
  rc2=$?
  if [ "$rc" -eq 0 ]; then rc=$rc2; fi
fi

echo "==> stopping the local services (at ${SECONDS} s)"
$BIN/python deploy/postgres/postgres.py stop || true
$BIN/python deploy/kafka/kafka.py stop || true
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here"
  exit 1
fi
exit "$rc"
