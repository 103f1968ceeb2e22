#!/usr/bin/env bash
# `make ee`: the execution environment image (execution-environment.yml, docs/execution-environment.md).
#
# 1. the collection tarball of `make dist` (rebuilt with scripts/dist.sh, without its sanity
#    run, when it is missing or a file of the checkout is newer);
# 2. scripts/ee_stage.py stages the build inputs under build/ee/stage/: the collection
#    tarballs (kvcache.offload, and its dependencies packed from the PyPI `ansible` package of
#    build/venv), the build-only pip settings read from this machine's pip configuration
#    (remote index, CA bundle), pip's pinned wheel; it prints the hash of every input;
# 3. the image kvcache-offload/ee:<hash> is built with ansible-builder (docker, no BuildKit, no
#    pull: FROM the local kvcache-offload/debian12-systemd:current) only when no image has
#    that tag yet; kvcache-offload/ee:current is tagged to it;
# 4. a smoke test of the image (scripts/ee.sh --smoke [image] runs it alone).
# `scripts/ee.sh --lock` rewrites ee/requirements.txt from ee/requirements.in.
# Prints the image reference as its last line.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
repo=kvcache-offload/ee
base=kvcache-offload/debian12-systemd:current
ee_dir="$here/build/ee"
export DOCKER_BUILDKIT=0

smoke() {
  local image=$1 out="$ee_dir/smoke" start
  start=$(date +%s)
  echo "==> ee: smoke test of $image" >&2
  rm -rf "$out" && mkdir -p "$out/report"
  docker run --rm "$image" ansible-playbook --version >"$out/version.txt"
  grep -q "^ansible-playbook \[core $(python -c 'import ansible.release as r; print(r.__version__)')\]" "$out/version.txt" \
    || { cat "$out/version.txt" >&2; echo "ee: ansible-core in the image is not the pinned one" >&2; exit 1; }
  docker run --rm "$image" ansible-galaxy collection list --format json >"$out/collections.json"
  docker run --rm "$image" python3 -m pip list --format json >"$out/pip-list.json"
  docker run --rm "$image" python3 -c 'import boto3, botocore, prometheus_client, jmespath, docker, requests, deepdiff, isodate, xmltodict, ansible_runner' \
    || { echo "ee: a controller-side Python package does not import in the image" >&2; exit 1; }
  python - "$out" <<'PY'
import json, os, sys
sys.path.insert(0, "scripts")
import ee_stage
out = sys.argv[1]
found = {}
for path, cols in json.load(open(os.path.join(out, "collections.json"))).items():
    for name, info in cols.items():
        found.setdefault(name, (info["version"], path))
fail = []
for ns, name, version, _f in ee_stage.collection_pins("ee/requirements.yml"):
    got = found.get("%s.%s" % (ns, name))
    if not got or got[0] != version:
        fail.append("collection %s.%s: want %s, image has %s" % (ns, name, version, got))
pins = ee_stage.read_pins("ee/requirements.txt")
for dist in json.load(open(os.path.join(out, "pip-list.json"))):
    key = ee_stage.normalize(dist["name"])
    if key in pins and pins[key] != dist["version"]:
        fail.append("python %s: pinned %s, image has %s" % (dist["name"], pins[key], dist["version"]))
    elif key not in pins and key not in ee_stage.BASE_IMAGE_PACKAGES:
        fail.append("python %s %s is in the image but not pinned in ee/requirements.txt" % (dist["name"], dist["version"]))
for key in pins:
    if key not in {ee_stage.normalize(d["name"]) for d in json.load(open(os.path.join(out, "pip-list.json")))}:
        fail.append("python %s is pinned but not in the image" % key)
if fail:
    sys.exit("ee: " + "\n    ".join(fail))
print("    %d collections (kvcache.offload %s in %s), %d Python packages, all as pinned"
      % (len(found), found["kvcache.offload"][0], found["kvcache.offload"][1],
         len(json.load(open(os.path.join(out, "pip-list.json"))))), file=sys.stderr)
PY
  # The collection's filter and module from the installed copy, on localhost, as a portal job.
  docker run --rm --user "$(id -u)" -v "$here/tests/integration/ee:/smoke:ro" -v "$out/report:/report" \
    -e EE_SMOKE_REPORT_DIR=/report "$image" \
    ansible-playbook -i /smoke/inventory.yml /smoke/smoke.yml >"$out/playbook.txt" 2>&1 \
    || { cat "$out/playbook.txt" >&2; echo "ee: the smoke playbook failed in the image" >&2; exit 1; }
  test -s "$out/report/validation-ee-smoke.json" \
    || { echo "ee: the smoke playbook wrote no validation report" >&2; exit 1; }
  echo "    ansible-playbook, collections, filter and module work ($(( $(date +%s) - start )) s)" >&2
}

if [ "${1:-}" = "--lock" ]; then
  python scripts/ee_stage.py lock
  exit 0
fi
if [ "${1:-}" = "--smoke" ]; then
  smoke "${2:-$repo:current}"
  echo "${2:-$repo:current}"
  exit 0
fi

start=$(date +%s)
base_id=$(docker image inspect --format '{{.Id}}' "$base" 2>/dev/null) \
  || { echo "ee: the base image $base is missing: make image" >&2; exit 1; }

version=$(python -c 'import yaml; print(yaml.safe_load(open("galaxy.yml"))["version"])')
tarball="$here/build/dist/kvcache-offload-$version.tar.gz"
newer=""
if [ -f "$tarball" ]; then
  # The first file of the checkout (tracked or not ignored) newer than the tarball, if any.
  # shellcheck disable=SC2016  # $0 and $@ belong to the inner sh
  newer=$(git ls-files -co --exclude-standard -z \
    | xargs -0 -r sh -c 'find "$@" -maxdepth 0 -newer "$0" -print 2>/dev/null' "$tarball" | head -n 1 || true)
fi
if [ -n "${KVCACHE_EE_TARBALL:-}" ]; then
  tarball=$KVCACHE_EE_TARBALL  # a tarball built elsewhere (ansible-galaxy collection build)
elif [ ! -f "$tarball" ] || [ -n "$newer" ]; then
  echo "==> ee: the collection tarball is missing or older than the checkout (${newer:-no tarball}): scripts/dist.sh" >&2
  DIST_SANITY=0 scripts/dist.sh >&2
fi

echo "==> ee: staging the build inputs (build/ee/stage)" >&2
tag=$(python scripts/ee_stage.py stage --tarball "$tarball" --base-image-id "$base_id" \
  2> >(grep -v '^WARNING: Location' >&2))
image="$repo:$tag"

if docker image inspect "$image" >/dev/null 2>&1; then
  echo "    $image is up to date (its inputs did not change)" >&2
else
  echo "==> ee: building $image with ansible-builder (log: build/ee/build.log)" >&2
  rm -rf "$ee_dir/context"
  ansible-builder build --file execution-environment.yml --context "$ee_dir/context" \
    --container-runtime docker --tag "$image" --verbosity 2 >"$ee_dir/build.log" 2>&1 \
    || { tail -n 60 "$ee_dir/build.log" >&2; echo "ee: ansible-builder failed (build/ee/build.log)" >&2; exit 1; }
  # The pull the build must not make: FROM is the local base image.
  if grep -qiE '^(Pulling from|Trying to pull)' "$ee_dir/build.log"; then
    echo "ee: the build pulled an image" >&2; exit 1
  fi
fi
docker tag "$image" "$repo:current"
# Earlier builds' tags go (their layers stay while another image uses them).
for old in $(docker images "$repo" --format '{{.Tag}}' | grep -vxE "current|$tag" || true); do
  docker rmi "$repo:$old" >/dev/null 2>&1 || true
done
echo "    $image: $(docker image inspect --format '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}') ($(( $(date +%s) - start )) s)" >&2
smoke "$image"
echo "$image"
