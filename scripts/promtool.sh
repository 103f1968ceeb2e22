#!/bin/sh
# promtool for the alert rules' unit tests (make unit, tests/unit/roles/test_observability_alerts.py):
# Debian's prometheus package, downloaded through the machine's own apt sources and extracted
# into build/tools (never installed: no Prometheus service starts on this machine). The .deb is
# kept in the download cache (KVCACHE_CACHE_DIR), so a clean clone downloads it once.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cache="${KVCACHE_CACHE_DIR:-$root/build/cache}/promtool"
out="$root/build/tools/promtool"
if [ -x "$out" ] && "$out" --version >/dev/null 2>&1; then
  exit 0
fi
mkdir -p "$cache" "$(dirname "$out")"
deb=$(ls "$cache"/prometheus_*.deb 2>/dev/null | tail -n 1 || true)
if [ -z "$deb" ]; then
  echo "==> promtool: Debian's prometheus package into $cache (extracted, not installed)"
  # apt-get download writes into the current directory; with no package lists yet, read them once.
  if ! (cd "$cache" && timeout 300 apt-get download -q prometheus >/dev/null 2>&1); then
    timeout 300 apt-get update -q >/dev/null 2>&1 || true
    (cd "$cache" && timeout 300 apt-get download -q prometheus >/dev/null) || {
      echo "promtool: 'apt-get download prometheus' failed: the unit tests of the alert rules need promtool." >&2
      echo "Fix: make the machine's apt sources reachable, or put a promtool binary at $out." >&2
      exit 1
    }
  fi
  deb=$(ls "$cache"/prometheus_*.deb | tail -n 1)
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dpkg-deb -x "$deb" "$tmp"
install -m 0755 "$tmp/usr/bin/promtool" "$out"
"$out" --version | head -n 1
