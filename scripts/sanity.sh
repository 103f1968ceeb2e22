#!/usr/bin/env bash
# Run `ansible-test sanity` offline on a copy of the collection laid out as
# ansible_collections/kvcache/offload (ansible-test needs that path): the checkout's files, or
# with `--from DIR` an installed collection (scripts/dist.sh). Other arguments go to ansible-test.
#
# ansible-test bootstraps pip in its own venvs with a get-pip script it downloads from
# a host this machine cannot reach; a stand-in that uses ensurepip + pip (trusting the
# system CA bundle, since ansible-test hides pip's own config) is seeded in its cache.
# HOME points into the download caches (KVCACHE_CACHE_DIR, which the Makefile sets outside the
# checkout; else build/) so nothing lands in the user's home, and the venvs ansible-test makes
# for its tests (keyed by their pinned requirements) are made once per machine, not once per
# clone: a cold `ansible-test sanity` took 145 s here, a warm one 77 s (issue #39).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build="$here/build"
export HOME="${KVCACHE_CACHE_DIR:-$build}/ansible-test-home"
# A private copy per run, so two runs (two developers, or CI) never share a tree.
mkdir -p "$build/sanity"
work=$(mktemp -d "$build/sanity/run.XXXXXX")
trap 'rm -rf "$work"' EXIT
tree="$work/ansible_collections/kvcache/offload"

at_pkg=$(python -c 'import ansible_test, os; print(os.path.dirname(ansible_test.__file__))')
pip_version=$(sed -n "s/^ *pip='\([0-9.]*\)',*$/\1/p" "$at_pkg/_internal/python_requirements.py" | head -1)
[ -n "$pip_version" ] || { echo "sanity: cannot find ansible-test's pip version" >&2; exit 1; }
cache="$HOME/.ansible/test/cache"
mkdir -p "$cache"
cat > "$cache/get_pip_${pip_version//./_}.py" <<'PY'
"""Stand-in for get-pip.py (written by scripts/sanity.sh): ensurepip, then pip."""
import os
import ssl
import subprocess
import sys

cafile = ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt"
if not os.path.exists(cafile):
    cafile = "/etc/ssl/certs/ca-certificates.crt"
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"])
subprocess.check_call([sys.executable, "-m", "pip", "install", "--cert", cafile] + args)
PY

mkdir -p "$tree"
if [ "${1:-}" = "--from" ]; then
  # A given tree (scripts/dist.sh: the collection installed from its tarball), copied whole.
  src=$2
  shift 2
  (cd "$src" && tar -cf - .) | tar -xf - -C "$tree"
else
  # A fresh copy of what git tracks (and new files git does not ignore).
  (cd "$here" && git ls-files -co --exclude-standard -z \
    | tar --null --ignore-failed-read -T - -cf - 2>/dev/null) | tar -xf - -C "$tree"
fi
cd "$tree"
# ansible-test lists files with git; the copy is its own repository, since the
# checkout's git ignores build/.
git init -q . && git add -A

python_version=$(python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
ansible-test sanity --color no --python "$python_version" "$@"
