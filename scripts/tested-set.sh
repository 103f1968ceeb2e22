#!/usr/bin/env bash
# Write inference_env's tested set of one profile (roles/inference_env/files/tested/): the lock
# the role's own resolution gives today for the matrix's pair, on this controller's Python and
# machine, with no tested set applied. Run it when a pair is (re)tested, then test the pair with
# the set it wrote: `make gpu-contract` for cuda, `make lab-test` for cpu (docs/roles/inference_env.md,
# "The tested set"). Nothing is installed: the role resolves only (inference_env_sync=false).
#
#   scripts/tested-set.sh cuda|cpu
#
# cpu resolves from this machine's local package sources too, as the lab does (scripts/pip-sources.py).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
profile=${1:-}
case "$profile" in
  cuda|cpu) ;;
  *) echo "usage: scripts/tested-set.sh cuda|cpu" >&2; exit 2 ;;
esac
export ANSIBLE_CONFIG="$here/ansible.cfg" ANSIBLE_COLLECTIONS_PATH="$here/build/collections" DO_NOT_TRACK=1
work="$here/build/tested-set/$profile"
cache="${KVCACHE_CACHE_DIR:-$here/build/cache}/gpu-contract"
rm -rf "$work"
mkdir -p "$work"
extra=(-e "{\"inference_env_profile\": \"$profile\", \"inference_env_sync\": false, \"inference_env_tested_set\": false}")
if [ "$profile" = cpu ]; then
  python scripts/pip-sources.py >"$work/pip-sources.json"
  extra+=(-e "$(python - "$work/pip-sources.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(json.dumps({"inference_env_find_links": s["find_links"], "inference_env_extra_index_urls": s["extra_index_urls"],
                  "inference_env_index_strategy": "unsafe-best-match"}))
PY
)")
fi
if ! ansible-playbook -i inventories/example -l gpu-a01 -e "gpu_contract_dir=$work" -e "gpu_contract_cache=$cache" \
    "${extra[@]}" tests/gpu_contract/playbooks/venv.yml >"$work/resolve.log" 2>&1; then
  tail -n 30 "$work/resolve.log"
  echo "tested-set: the role could not resolve the $profile pair (log: $work/resolve.log)" >&2
  exit 1
fi
python - "$work" "$profile" <<'PY'
import json, os, re, sys
work, profile = sys.argv[1:]
info = json.load(open(os.path.join(work, "current.json")))
lock = os.path.join(info["pair_dir"], "requirements", "requirements.lock")
pins = [line for line in open(lock).read().splitlines() if line.strip() and not line.lstrip().startswith("#")]
bad = [line for line in pins if not re.match(r"^[A-Za-z0-9_.-]+==\S+$", line)]
if bad:
    sys.exit("tested-set: not a plain name==version line in %s: %s" % (lock, bad[:3]))
# The file the role looked for, named by the engine Python's version and the machine it asked.
constraints = open(os.path.join(info["pair_dir"], "requirements", "constraints.txt")).read()
name = re.search(r"No tested set for (\S+\.txt)", constraints).group(1)
python, machine = re.search(r"-py(\d+\.\d+)-([^-]+)\.txt$", name).groups()
how = {"cuda": "the GPU contract installed and passed with (make gpu-contract)",
       "cpu": "the lab runs end to end (make lab-test)"}[profile]
header = (
    "# The tested set of inference_env's %s profile: every package of the venv, at the version\n"
    "# %s\n"
    "# on Python %s, %s. The role resolves this pair within it (uv pip compile\n"
    "# --constraint; inference_env_tested_set), so that every node, whenever it is converged, gets\n"
    "# these versions and not whatever the package index holds that day. Written by\n"
    "# scripts/tested-set.sh from the role's own resolution; change it only with the pair retested.\n"
    % (profile, how, python, machine))
dest = os.path.join("roles", "inference_env", "files", "tested", name)
with open(dest, "w") as handle:
    handle.write(header + "\n".join(pins) + "\n")
print("==> %s: %d packages (%s)" % (dest, len(pins), ", ".join(p for p in pins if p.split("==")[0] in (info["package"], "lmcache", "torch"))))
PY
