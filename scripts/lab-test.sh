#!/usr/bin/env bash
# The lab end to end, as CI runs it: from nothing, `make lab` twice (the second run
# must report changed=0 on every host), then the lab's integration tests
# (tests/integration/lab), then the lab is removed again (KVCACHE_KEEP_LAB=1 keeps it).
set -euo pipefail
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

echo "==> lab: removing any previous lab"
make --no-print-directory lab-down >"$logs/lab-down-before.log" 2>&1

echo "==> lab: first run (log: build/lab-test/first.log)"
start=$(date +%s)
if ! make --no-print-directory lab >"$logs/first.log" 2>&1; then
  tail -n 80 "$logs/first.log"
  echo "lab-test: the first 'make lab' failed" >&2
  exit 1
fi
echo "    first run took $(( $(date +%s) - start )) s"

echo "==> lab: second run must change nothing (log: build/lab-test/second.log)"
start=$(date +%s)
if ! make --no-print-directory lab >"$logs/second.log" 2>&1; then
  tail -n 80 "$logs/second.log"
  echo "lab-test: the second 'make lab' failed" >&2
  exit 1
fi
echo "    second run took $(( $(date +%s) - start )) s"
recaps=$(grep -E '^[A-Za-z0-9_.-]+ +: ok=[0-9]+ +changed=[0-9]+' "$logs/second.log")
echo "$recaps" | sed 's/^/    /'
if echo "$recaps" | grep -Eq 'changed=[1-9]'; then
  echo "lab-test: the second run changed something; what changed:" >&2
  grep -E '^(changed|TASK)' "$logs/second.log" | grep -B1 '^changed' >&2 || true
  exit 1
fi
if [ "$(echo "$recaps" | wc -l)" -lt 1 ]; then
  echo "lab-test: no PLAY RECAP found in the second run's log" >&2
  exit 1
fi

echo "==> lab: integration tests"
python -m pytest tests/integration/lab -p no:cacheprovider -q -o testpaths=tests/integration/lab

echo "==> lab: benchmark smoke (build/bench/bench.md)"
python scripts/bench.py --smoke --no-venv-create > "$logs/bench-smoke.log" 2>&1 \
  || { tail -n 40 "$logs/bench-smoke.log"; echo "lab-test: the benchmark smoke run failed" >&2; exit 1; }
tail -n 5 "$logs/bench-smoke.log" | sed 's/^/    /'
