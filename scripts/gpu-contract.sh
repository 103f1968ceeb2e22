#!/usr/bin/env bash
# `make gpu-contract`: the GPU path without a GPU (docs/gpu-acceptance.md).
#
# 1. venv: exactly the lock inference_env installs on a GPU node of the example inventory
#    (profile cuda), built by the role's own tasks (tests/gpu_contract/playbooks/venv.yml)
#    into build/gpu-contract/pins-<vllm>-<lmcache>/venv. Cached: the role resolves again only
#    when the pins change and installs only when the venv does not hold the lock; with
#    nothing changed in the role or the inventory, the playbook is not even run.
# 2. render: the roles' templates for every point of the matrix
#    (tests/gpu_contract/playbooks/render.yml), cached by a hash of what they are made from.
# 3. tests: tests/gpu_contract with that venv's own Python (pytest from a small overlay
#    appended to the end of sys.path, so the venv's packages always win).
#
# GPU_CONTRACT_PAIR=<vllm>,<lmcache> runs the contract on a candidate pair instead of the
# matrix's pins (it is resolved with inference_env_allow_untested=true).
# GPU_CONTRACT_PHASE=venv stops after step 1 (`make gpu-contract-venv`: make test builds the
# venv, mostly downloads and disk writes, while `make check` keeps the CPU busy).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
dir="$here/build/gpu-contract"
# uv's download cache: outside the checkout when the Makefile says so (KVCACHE_CACHE_DIR), so that a
# clean clone on this machine does not download the CUDA wheels again.
cache="${KVCACHE_CACHE_DIR:-$here/build/cache}/gpu-contract"
logs="$dir/logs"
mkdir -p "$logs"
export DO_NOT_TRACK=1 VLLM_NO_USAGE_STATS=1 LMCACHE_TRACK_USAGE=false HF_HUB_OFFLINE=1

hash_of() {  # sha256 over the contents of every file under the given paths, and extra words
  local paths=() words=()
  for arg in "$@"; do if [ -e "$arg" ]; then paths+=("$arg"); else words+=("$arg"); fi; done
  { find "${paths[@]}" -type f ! -name '*.pyc' -print0 | sort -z | xargs -0 sha256sum; printf '%s\n' "${words[@]}"; } \
    | sha256sum | cut -d' ' -f1
}

playbook=(ansible-playbook -i inventories/example -l gpu-a01 -e "gpu_contract_dir=$dir" -e "gpu_contract_cache=$cache")
pair_args=()
pair_name=matrix
if [ -n "${GPU_CONTRACT_PAIR:-}" ]; then
  vllm=${GPU_CONTRACT_PAIR%%,*}
  lmcache=${GPU_CONTRACT_PAIR##*,}
  pair_args=(-e "{\"inference_env_vllm_version\": \"$vllm\", \"inference_env_lmcache_version\": \"$lmcache\", \"inference_env_allow_untested\": true}")
  pair_name="$vllm-$lmcache"
fi
info="$dir/current-$pair_name.json"

# --- 1. the venv ---
start=$(date +%s)
venv_key=$(hash_of roles/inference_env roles/kvcache inventories/example tests/gpu_contract/playbooks/venv.yml \
  "${pair_args[@]}" "$(python -c 'import ansible.release as r; print(r.__version__)')")
venv_ok=false
if [ -f "$info" ] && [ "$(cat "$dir/venv-$pair_name.stamp" 2>/dev/null)" = "$venv_key" ]; then
  pair_dir=$(python -c 'import json,sys; print(json.load(open(sys.argv[1]))["pair_dir"])' "$info")
  if cmp -s "$pair_dir/requirements/requirements.lock" "$pair_dir/venv/kvcache-requirements.lock"; then
    venv_ok=true
  fi
fi
if $venv_ok; then
  echo "==> GPU contract: venv unchanged ($pair_dir)"
else
  echo "==> GPU contract: venv with inference_env's own resolution of the cuda profile (log: build/gpu-contract/logs/venv.log)"
  rm -f "$dir/venv-$pair_name.stamp"
  if ! "${playbook[@]}" "${pair_args[@]}" tests/gpu_contract/playbooks/venv.yml >"$logs/venv.log" 2>&1; then
    tail -n 60 "$logs/venv.log"
    echo "gpu-contract: the venv could not be built" >&2
    exit 1
  fi
  cp "$dir/current.json" "$info"
  echo "$venv_key" >"$dir/venv-$pair_name.stamp"
  echo "    took $(( $(date +%s) - start )) s"
fi
read -r venv vllm_version lmcache_version tested < <(python -c '
import json, sys
i = json.load(open(sys.argv[1]))
print(i["venv"], i["vllm"], i["lmcache"], "yes" if i["tested"] else "no")' "$info")
echo "    vllm $vllm_version + lmcache $lmcache_version (marked tested in the matrix: $tested); $(du -sh "$venv" | cut -f1) venv"
if [ "${GPU_CONTRACT_PHASE:-all}" = venv ]; then
  exit 0
fi

# --- 2. the rendered settings ---
render_key=$(hash_of roles/kvcache roles/lmcache roles/vllm roles/gds inventories/example plugins \
  tests/gpu_contract/playbooks tests/unit/fixtures/nvidia_smi "$(python -c 'import ansible.release as r; print(r.__version__)')")
if [ -f "$dir/rendered.json" ] && [ "$(cat "$dir/render.stamp" 2>/dev/null)" = "$render_key" ]; then
  echo "==> GPU contract: rendered settings unchanged"
else
  echo "==> GPU contract: rendering the roles' templates for the matrix (log: build/gpu-contract/logs/render.log)"
  start=$(date +%s)
  rm -f "$dir/render.stamp"
  if ! "${playbook[@]}" tests/gpu_contract/playbooks/render.yml >"$logs/render.log" 2>&1; then
    tail -n 60 "$logs/render.log"
    echo "gpu-contract: the roles could not render the GPU path (a role check failed, or a template)" >&2
    exit 1
  fi
  echo "$render_key" >"$dir/render.stamp"
  echo "    took $(( $(date +%s) - start )) s"
fi

# --- 3. the tests, with the contract venv's Python ---
# pytest and its dependencies the venv lacks, at the tool venv's versions (requirements-dev.txt),
# in an overlay appended to sys.path: the venv itself stays exactly the lock.
overlay="$dir/pytest-overlay"
missing=$("$venv/bin/python" - <<'PY'
import importlib.metadata as m
out = []
for name in ("pytest", "pluggy", "iniconfig", "packaging", "pygments"):
    try:
        m.version(name)
    except m.PackageNotFoundError:
        out.append(name)
print(" ".join(out))
PY
)
overlay_key="$missing $(python -c 'import importlib.metadata as m; print(" ".join("%s==%s" % (p, m.version(p)) for p in ("pytest", "pluggy", "iniconfig", "packaging", "pygments")))')"
if [ -n "$missing" ] && [ "$(cat "$overlay/.stamp" 2>/dev/null)" != "$overlay_key" ]; then
  rm -rf "$overlay"
  # $missing is a list of package names: split on purpose.
  # shellcheck disable=SC2086
  pins=$(python -c 'import importlib.metadata as m, sys; print(" ".join("%s==%s" % (p, m.version(p)) for p in sys.argv[1:]))' $missing)
  # shellcheck disable=SC2086
  python -m pip install --quiet --no-deps --target "$overlay" $pins
  echo "$overlay_key" >"$overlay/.stamp"
fi

echo "==> GPU contract: tests against vllm $vllm_version + lmcache $lmcache_version (report: build/gpu-contract/logs/report-$pair_name.xml)"
start=$(date +%s)
rc=0
GPU_CONTRACT_RENDERED="$dir/rendered.json" GPU_CONTRACT_INFO="$info" VLLM_LOGGING_LEVEL=WARNING \
  "$venv/bin/python" -c 'import sys; sys.path.append(sys.argv.pop(1)); import pytest; sys.exit(pytest.main(sys.argv[1:]))' \
  "$overlay" -c tests/gpu_contract/pytest.ini tests/gpu_contract -q -rfExX --durations=5 \
  --junitxml "$logs/report-$pair_name.xml" "$@" || rc=$?
echo "    tests took $(( $(date +%s) - start )) s"
if [ "$rc" -ne 0 ]; then
  echo "gpu-contract: vllm $vllm_version + lmcache $lmcache_version FAILED the contract (marked tested in the matrix: $tested)" >&2
fi
exit "$rc"
