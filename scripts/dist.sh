#!/usr/bin/env bash
# `make dist`: the collection as the artifact a portal installs (docs/development.md).
#
# 1. build: `ansible-galaxy collection build` into build/dist/ (galaxy.yml's build_ignore keeps
#    the lab, the tests and the tooling out: no SeaweedFS s3_store role, no lab_* playbook, no
#    lab inventory);
# 2. install: `ansible-galaxy collection install` of that tarball into an empty
#    build/dist/collections (--no-deps: the collections it needs come from the PyPI `ansible`
#    package of the venv; nothing is fetched from Galaxy);
# 3. check what shipped: nothing lab-only in it, every role and playbook a production run needs;
# 4. `ansible-test sanity` on the installed copy (scripts/sanity.sh --from), every test but
#    pylint: pylint judges each Python file by its own bytes, which `make check` lints in the
#    tree (the artifact's Python files are the tree's, checked below by nothing-lab-only and
#    by `import`/`validate-modules` here, which do depend on what the artifact holds); it was
#    36 of this step's 60 s. DIST_SANITY_ARGS replaces the skip (e.g. DIST_SANITY_ARGS= runs all).
# The lab test tests/integration/lab/test_installed_collection.py runs a playbook from that copy.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
dist="$here/build/dist"
rm -rf "$dist"
mkdir -p "$dist/collections"
version=$(python -c 'import yaml; print(yaml.safe_load(open("galaxy.yml"))["version"])')
tarball="$dist/kvcache-offload-$version.tar.gz"

echo "==> dist: ansible-galaxy collection build"
ansible-galaxy collection build --force --output-path "$dist" . >"$dist/build.log" 2>&1 \
  || { cat "$dist/build.log"; echo "dist: the build failed" >&2; exit 1; }
echo "    $(basename "$tarball"): $(du -h "$tarball" | cut -f1), $(tar -tzf "$tarball" | grep -vc '/$') files"

echo "==> dist: ansible-galaxy collection install into an empty path"
ANSIBLE_COLLECTIONS_PATH="$dist/collections" ansible-galaxy collection install --offline --no-deps --force \
  -p "$dist/collections" "$tarball" >"$dist/install.log" 2>&1 \
  || { cat "$dist/install.log"; echo "dist: the install failed" >&2; exit 1; }
installed="$dist/collections/ansible_collections/kvcache/offload"

echo "==> dist: what shipped"
fail=0
for lab_only in roles/s3_store inventories/lab playbooks/lab_up.yml playbooks/lab_down.yml playbooks/lab_info.yml ee execution-environment.yml \
    tests molecule scripts Makefile .ci; do
  if [ -e "$installed/$lab_only" ]; then echo "dist: lab-only or tooling content shipped: $lab_only" >&2; fail=1; fi
done
for needed in roles/vllm roles/lmcache roles/nvidia_driver roles/router roles/validation roles/ontap_nfs \
    roles/storagegrid_s3 roles/kvcache_mount playbooks/site.yml playbooks/preflight.yml playbooks/validate.yml \
    plugins/modules/validation_report.py plugins/filter/router_backends.py meta/runtime.yml MANIFEST.json; do
  if [ ! -e "$installed/$needed" ]; then echo "dist: missing from the artifact: $needed" >&2; fail=1; fi
done
# A production playbook must not reach a lab-only role: no static reference to one.
if grep -rnE '^\s*-?\s*(role|name):\s*kvcache\.offload\.s3_store' "$installed/playbooks" "$installed/roles" \
    | grep -v 'include_role' | grep -vE 'storage.yml|preflight.yml' ; then
  echo "dist: a shipped playbook or role names the lab-only s3_store role statically" >&2; fail=1
fi
[ "$fail" -eq 0 ] || exit 1
# (Read whole first: `... | grep -q` ends the pipe early and pipefail then fails on SIGPIPE.)
listed=$(ANSIBLE_COLLECTIONS_PATH="$dist/collections" ansible-galaxy collection list kvcache.offload 2>/dev/null || true)
case "$listed" in
  *"$dist/collections"*) ;;
  *) echo "dist: ansible-galaxy does not list the installed copy: $listed" >&2; exit 1 ;;
esac
echo "    nothing lab-only shipped; $(find "$installed/roles" -mindepth 1 -maxdepth 1 -type d | wc -l) roles, $(find "$installed/plugins/modules" -maxdepth 1 -name '*.py' | wc -l) modules"

if [ "${DIST_SANITY:-1}" = "1" ]; then
  echo "==> dist: ansible-test sanity on the installed copy"
  start=$(date +%s)
  # shellcheck disable=SC2086
  scripts/sanity.sh --from "$installed" ${DIST_SANITY_ARGS---skip-test pylint} >"$dist/sanity.log" 2>&1 \
    || { tail -n 60 "$dist/sanity.log"; echo "dist: ansible-test sanity failed on the artifact" >&2; exit 1; }
  echo "    passed in $(( $(date +%s) - start )) s"
fi
