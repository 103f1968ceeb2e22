#!/usr/bin/env bash
# Run molecule scenarios, MOLECULE_JOBS at a time (default 2), longest first.
#   scripts/molecule-run.sh SCENARIO...
# Each scenario logs to build/molecule-<scenario>.log and has its own containers, so they
# do not share state. A failed scenario prints its failed tasks (`fatal:` blocks) and the
# end of its log; the run fails when any scenario failed, after the others have finished.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build="${KVCACHE_BUILD_DIR:-$here/build}"
jobs="${MOLECULE_JOBS:-2}"
mkdir -p "$build"

if [ "${1:-}" = "--one" ]; then
  scenario=$2
  log="$build/molecule-$scenario.log"
  start=$(date +%s)
  echo "==> molecule: $scenario (started)"
  if molecule test -s "$scenario" >"$log" 2>&1; then
    echo "    $scenario passed in $(( $(date +%s) - start )) s"
    exit 0
  fi
  {
    echo "==> molecule: $scenario FAILED after $(( $(date +%s) - start )) s (log: build/molecule-$scenario.log)"
    grep -E -B3 -A40 '^(fatal|failed):|^FAILED!' "$log" | tail -n 150 || true
    tail -n 25 "$log"
    echo "molecule: $scenario failed (log: build/molecule-$scenario.log)"
  } | flock "$build/.molecule-output.lock" cat
  exit 1
fi

# Longest first (measured on 2 cores), so the long ones do not end up last in one lane.
order="nodes router_container s3_store router kvcache_mount container_runtime nvidia_driver observability kvcache_prune preflight"
scenarios=()
for s in $order; do
  for want in "$@"; do [ "$want" = "$s" ] && scenarios+=("$s"); done
done
for want in "$@"; do
  case " $order " in *" $want "*) ;; *) scenarios+=("$want") ;; esac
done
[ ${#scenarios[@]} -gt 0 ] || { echo "molecule-run: no scenario given" >&2; exit 2; }

start=$(date +%s)
echo "==> molecule: ${#scenarios[@]} scenarios, $jobs at a time"
status=0
printf '%s\n' "${scenarios[@]}" | xargs -P "$jobs" -I{} "$0" --one {} || status=$?
echo "    molecule took $(( $(date +%s) - start )) s"
if [ "$status" -ne 0 ]; then
  echo "molecule: at least one scenario failed" >&2
  exit 1
fi
