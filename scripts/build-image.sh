#!/usr/bin/env bash
# Build the local Debian systemd image used by molecule and the lab, with no registry:
# mmdebstrap from the host's own apt sources, piped into `docker import`.
# The tag carries a hash of this recipe, so the image is rebuilt only when it changes.
# Prints the image reference on stdout.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
repo=kvcache-offload/debian12-systemd
packages="systemd,systemd-sysv,dbus,python3,python3-apt,sudo,ca-certificates,iproute2,procps,iputils-ping,less"

sources=$(python3 "$here/scripts/apt-sources.py")
recipe_hash=$( { cat "$0"; echo "$packages"; echo "$sources"; } | sha256sum | cut -c1-12)
image="$repo:$recipe_hash"

if docker image inspect "$image" >/dev/null 2>&1; then
  docker tag "$image" "$repo:current"
  echo "$image"
  exit 0
fi

if ! command -v mmdebstrap >/dev/null 2>&1; then
  echo "==> installing mmdebstrap" >&2
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq mmdebstrap >/dev/null
fi

echo "==> building $image with mmdebstrap (about a minute)" >&2
# Hooks run in the new root and trim units that make no sense in a container. The apt
# lists stay, as on a freshly installed server (apt's cache_valid_time then works).
# The hooks' "$1" is expanded by mmdebstrap (the new root), not here: single quotes on purpose.
# shellcheck disable=SC2016
# Containers must be run with stop signal SIGRTMIN+3: this Docker cannot bake STOPSIGNAL
# into an imported image. The image's apt sources are the host's.
mmdebstrap --quiet --variant=minbase --include="$packages" --skip=cleanup/apt/lists \
  --customize-hook='chroot "$1" systemctl mask getty.target systemd-udevd.service systemd-udev-trigger.service systemd-remount-fs.service systemd-firstboot.service sys-kernel-debug.mount sys-kernel-tracing.mount dev-hugepages.mount' \
  --customize-hook='rm -f "$1"/etc/machine-id && : > "$1"/etc/machine-id' \
  bookworm - "$sources" \
  | docker import \
      --change 'ENV container=docker' \
      --change 'CMD ["/lib/systemd/systemd"]' \
      - "$image" >/dev/null
docker tag "$image" "$repo:current"
echo "$image"
