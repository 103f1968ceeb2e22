#!/usr/bin/env bash
# The lab end to end, as CI runs it: from nothing, `make lab`, then the lab's integration
# tests (tests/integration/lab; the execution environment's site.yml run, eejob.py, is a rerun
# that must report changed=0 on every host), then the lab is removed again (KVCACHE_KEEP_LAB=1 keeps it).
#
# `lab-test.sh up` does only the first part (from nothing to a converged lab, kept up) and
# `lab-test.sh tests` only the second (the tests on that lab, then its removal): `make test`
# brings the lab up in its container lane while the controller suites run, and tests it
# after both lanes have ended (the fault tests time engine restarts on a quiet machine).
set -euo pipefail
phase=${1:-all}
case "$phase" in
  all|up|tests) ;;
  *) echo "lab-test.sh: unknown phase '$phase' (all, up or tests)" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
logs="$here/build/lab-test"
mkdir -p "$logs"

cleanup() {
  if [ "${KVCACHE_KEEP_LAB:-0}" != "1" ]; then
    make --no-print-directory lab-down >"$logs/lab-down.log" 2>&1 || true
  fi
}
trap cleanup EXIT

bring_up() {
  echo "==> lab: removing any previous lab"
  make --no-print-directory lab-down >"$logs/lab-down-before.log" 2>&1

  echo "==> lab: first run (log: build/lab-test/first.log)"
  local start
  start=$(date +%s)
  if ! make --no-print-directory lab >"$logs/first.log" 2>&1; then
    tail -n 80 "$logs/first.log"
    echo "lab-test: the first 'make lab' failed" >&2
    exit 1
  fi
  echo "    first run took $(( $(date +%s) - start )) s"
}

run_tests() {
  # Idempotence: the execution environment runs site.yml again through ansible-runner
  # (tests/integration/lab/eejob.py, after the fault tests, which restore what they break) and
  # test_runner.py fails on any changed task, naming it; a second `make lab` would repeat that run.
  # test_mitogen_rerun.py reruns site.yml under the Mitogen opt-in (docs/mitogen.md).
  make --no-print-directory mitogen >/dev/null
  echo "==> lab: integration tests"
  # Each test file's wall time goes into make test's suite table (scripts/suite-time.py).
  local rc=0
  rm -f "$logs/junit.xml"
  python -m pytest tests/integration/lab -p no:cacheprovider -q -o testpaths=tests/integration/lab --durations=0 \
    --junitxml="$logs/junit.xml" -o junit_family=xunit1 || rc=$?
  if [ -f "$logs/junit.xml" ]; then python scripts/suite-time.py junit "lab test" "$logs/junit.xml" || true; fi
  [ "$rc" -eq 0 ] || exit "$rc"

  echo "==> lab: benchmark smoke (build/bench/bench.md)"
  python scripts/suite-time.py run "bench smoke" -- python scripts/bench.py --smoke --no-venv-create > "$logs/bench-smoke.log" 2>&1 \
    || { tail -n 40 "$logs/bench-smoke.log"; echo "lab-test: the benchmark smoke run failed" >&2; exit 1; }
  tail -n 5 "$logs/bench-smoke.log" | sed 's/^/    /'
}

case "$phase" in
  up)
    bring_up
    trap - EXIT   # kept up for `lab-test.sh tests`
    ;;
  tests)
    if ! docker container inspect kvcache-lab-node1 >/dev/null 2>&1; then
      echo "lab-test: no lab to test (run 'scripts/lab-test.sh up' first, or 'make lab-test')" >&2
      exit 1
    fi
    run_tests
    ;;
  all)
    bring_up
    run_tests
    ;;
esac
