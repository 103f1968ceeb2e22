#!/usr/bin/env bash
# Make sure a Docker engine answers on this machine.
# Installs Debian's docker.io when no engine is present and, where no service manager
# runs it (no systemd as PID 1, as in CI), starts dockerd in the background.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
log_dir="${KVCACHE_BUILD_DIR:-$here/build}"
mkdir -p "$log_dir"

if docker info >/dev/null 2>&1; then
  exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
  echo "==> installing Debian's docker.io (the Docker engine)"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq docker.io >/dev/null
fi

if [ "$(ps -o comm= -p 1)" = "systemd" ] && systemctl list-unit-files docker.service >/dev/null 2>&1; then
  systemctl start docker
else
  echo "==> starting dockerd in the background (log: $log_dir/dockerd.log)"
  # Container traffic stays on local bridges; nothing here reaches a registry.
  nohup dockerd >>"$log_dir/dockerd.log" 2>&1 &
fi

for _ in $(seq 1 60); do
  if docker info >/dev/null 2>&1; then
    exit 0
  fi
  sleep 1
done
echo "ERROR: dockerd did not answer within 60 s; see $log_dir/dockerd.log" >&2
exit 1
