#!/usr/bin/env bash
# `make fleet`: inventories/example, as shipped, on GPU-shaped systemd containers (issue #18;
# what it proves and what it cannot: docs/lab.md, "The GPU-shaped fleet").
#
#   gpu-a01    HGX-style H100 x8 with NVSwitches   kvcache-fleet-gpu-a01   172.29.120.11
#   gpu-a02    PCIe server, L40S x2, no NVSwitch   kvcache-fleet-gpu-a02   172.29.120.12
#   router-01  the router host                     kvcache-fleet-router-01 172.29.120.5
#
# Own docker network (kvcache-fleet, 172.29.120.0/24) and names (kvcache-fleet-*): the lab's
# and the bench's containers are never touched. nvidia-smi and mokutil are shims replaying
# captured outputs (tests/integration/fleet/fixtures/README.md). What the harness adds to the
# example is an inventory of connection details and addresses only (build/fleet/inventory.yml:
# the docker connection, the containers' addresses, the example's vault stand-in, and this
# machine's CA for the TLS-inspecting proxy in front of PyPI); never a role variable.
#
# What this machine lacks, and what stands in (each also in docs/lab.md):
#   - NVIDIA's repository (not reachable) and a GPU: host preparation runs in CHECK MODE
#     (the driver role plans against the replayed nvidia-smi; its published facts are asserted),
#     with a double of NVIDIA's repository index and the driver's persistenced unit staged for
#     that run only (tests/integration/fleet/fixtures/nvidia-repo/README.md).
#   - The ONTAP cluster and an NFS/RDMA client in this kernel: the storage stage runs in check
#     mode, on the nodes only (the ONTAP side has its own tests against the strict API double:
#     make integration), with rpcrdma's loading skipped (no loadable modules here). The nodes'
#     tier path is therefore not a mount: the tests assert the mount the role plans.
#   - The CUDA venv (8 GB): make gpu-contract's venv, built by inference_env's own tasks from
#     the same lock, mounted READ-ONLY at the venv path; inference_env resolves the lock on
#     the node and finds the venv already holds it (nothing is installed or copied).
#   - The model: its config.json only, staged at kvcache_model (engines are never started).
#   - Running engines: the router (the default, vllm_router, waits for its workers) runs in
#     check mode.
# Engines are installed and configured, never started: every run passes
# -e vllm_start_instances=false (the production knob for exactly that; issue #18 names it).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
state="$here/build/fleet"
logs="$state/logs"
fleet_dir="$here/tests/integration/fleet"
image=kvcache-offload/debian12-systemd:current
network=kvcache-fleet
subnet=172.29.120.0/24
gateway=172.29.120.1
declare -A address=([gpu-a01]=172.29.120.11 [gpu-a02]=172.29.120.12 [router-01]=172.29.120.5)
nodes=(gpu-a01 gpu-a02)
hosts=(gpu-a01 gpu-a02 router-01)
venv_path=/opt/kvcache/venv
model_path=/models/Llama-3.1-8B-Instruct
mkdir -p "$logs"
rm -f "$state"/record-*.json "$logs"/*.log
# The Makefile's environment, when run directly.
export PATH="$here/build/venv/bin:$PATH" ANSIBLE_CONFIG=${ANSIBLE_CONFIG:-$here/ansible.cfg}
export ANSIBLE_HOME=${ANSIBLE_HOME:-$here/build/ansible-home} ANSIBLE_LOCAL_TEMP=${ANSIBLE_LOCAL_TEMP:-$here/build/ansible-home/tmp}
export ANSIBLE_COLLECTIONS_PATH=${ANSIBLE_COLLECTIONS_PATH:-$here/build/collections} ANSIBLE_FORCE_COLOR=0
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$here/build/cache} DO_NOT_TRACK=1 VLLM_NO_USAGE_STATS=1 LMCACHE_TRACK_USAGE=false
t0=$(date +%s)
say() { echo "==> fleet: $*"; }
elapsed() { echo "$(( $(date +%s) - t0 )) s"; }

# --- the CUDA venv of make gpu-contract (this target runs after it) ---
info="$here/build/gpu-contract/current-matrix.json"
if [ -n "${FLEET_CONTRACT_VENV:-}" ]; then
  contract_venv=$FLEET_CONTRACT_VENV
elif [ ! -f "$info" ]; then
  echo "fleet: no GPU contract venv ($info). Fix: run make gpu-contract first (make test does)." >&2
  exit 1
else
  contract_venv=$(python -c 'import json,sys; print(json.load(open(sys.argv[1]))["venv"])' "$info")
fi
test -x "$contract_venv/bin/python" || { echo "fleet: $contract_venv is not a venv. Fix: make gpu-contract" >&2; exit 1; }

# --- containers ---
container() { echo "kvcache-fleet-$1"; }
remove_fleet() {
  for h in "${hosts[@]}"; do docker rm -f "$(container "$h")" >/dev/null 2>&1 || true; done
  docker network rm "$network" >/dev/null 2>&1 || true
}
if [ "${FLEET_KEEP:-0}" != 1 ]; then trap remove_fleet EXIT; fi
remove_fleet
say "containers on $network ($subnet)"
docker network create --subnet "$subnet" --gateway "$gateway" "$network" >/dev/null
for h in "${hosts[@]}"; do
  volumes=(-v /sys/fs/cgroup:/sys/fs/cgroup:ro)
  if [[ " ${nodes[*]} " == *" $h "* ]]; then
    volumes+=(-v "$fleet_dir/fixtures/$h:/etc/kvcache-fleet/gpu:ro"
              -v "$fleet_dir/shims/nvidia-smi:/usr/local/bin/nvidia-smi:ro"
              -v "$fleet_dir/shims/mokutil:/usr/local/bin/mokutil:ro"
              -v "$contract_venv:$venv_path:ro")
  fi
  # NET_ADMIN: kvcache_firewall loads its nftables table in the host's own network namespace,
  # as on a real server (docker's rules on this machine are untouched).
  docker run --detach --name "$(container "$h")" --hostname "$h" --label kvcache.offload.fleet=1 \
    --network "$network" --ip "${address[$h]}" --env container=docker --stop-signal SIGRTMIN+3 \
    --shm-size 1g --tmpfs /run --tmpfs /run/lock --tmpfs /tmp "${volumes[@]}" \
    --cap-add NET_ADMIN "$image" /lib/systemd/systemd >/dev/null
done
for h in "${hosts[@]}"; do
  for _ in $(seq 60); do
    s=$(docker exec "$(container "$h")" systemctl is-system-running 2>/dev/null || true)
    case "$s" in running|degraded) break ;; esac
    sleep 1
  done
done
for h in "${nodes[@]}"; do
  docker exec "$(container "$h")" mkdir -p "$model_path"
  docker cp "$fleet_dir/fixtures/model/config.json" "$(container "$h"):$model_path/config.json"
done
# What every Debian server has and this minimal image lacks: kmod (modprobe; the NFS/RDMA
# mount loads rpcrdma with it).
for h in "${nodes[@]}"; do
  docker exec "$(container "$h")" sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends kmod' >"$logs/$h-kmod.log" 2>&1 &
done
wait
# gpu-a02's next free system UID/GID differ from gpu-a01's: one more system account first.
docker exec "$(container gpu-a02)" useradd --system --no-create-home --shell /usr/sbin/nologin fleet-other
say "containers up ($(elapsed))"

# --- the inventory overlay: connection details and addresses only ---
python - "$state/inventory.yml" "$state/machine.yml" <<'EOF'
import glob, sys, yaml
vault = yaml.safe_load(open("inventories/example/group_vars/all/vault.yml.example"))
# The documented edit of vault.yml: fill in. The API key is a random one (preflight refuses the
# example's placeholder, and any key shorter than 32 characters).
import secrets
vault["vault_kvcache_api_key"] = secrets.token_urlsafe(33)
vault["vault_kvcache_hash_seed"] = secrets.randbelow(2**32)
# The router's TLS front: a throw-away self-signed certificate and a client key.
import datetime, ipaddress
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
key = ec.generate_private_key(ec.SECP256R1())
name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "router-01")])
now = datetime.datetime.now(datetime.timezone.utc)
cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("172.29.120.5"))]), critical=False)
        .sign(key, hashes.SHA256()))
vault["vault_router_tls_cert"] = cert.public_bytes(serialization.Encoding.PEM).decode()
vault["vault_router_tls_key"] = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()).decode()
vault["vault_router_client_api_keys"] = [secrets.token_hex(24)]
hosts = {"gpu-a01": "172.29.120.11", "gpu-a02": "172.29.120.12", "router-01": "172.29.120.5"}
def host(name):
    return {"ansible_host": hosts[name], "ansible_docker_host": "kvcache-fleet-" + name,
            "ansible_connection": "community.docker.docker", "ansible_python_interpreter": "/usr/bin/python3"}
inventory = {"all": {
    "vars": dict(vault),
    "children": {
        "kvcache_nodes": {"hosts": {"gpu-a01": host("gpu-a01"), "gpu-a02": host("gpu-a02")}},
        "kvcache_router": {"hosts": {"router-01": host("router-01")}},
    }}}
with open(sys.argv[1], "w") as handle:
    handle.write("# Written by scripts/fleet-test.sh: connection details and addresses of the fleet's containers.\n")
    yaml.safe_dump(inventory, handle, default_flow_style=False, sort_keys=True)
# This machine reaches PyPI through a TLS-inspecting proxy: its CA, as the lab does. An -e file,
# because the example's group_vars/all sets ca_trust_certificates: [] (an inventory cannot override it).
with open(sys.argv[2], "w") as handle:
    handle.write("# Written by scripts/fleet-test.sh: this machine's access to its package sources.\n")
    yaml.safe_dump({"ca_trust_certificates": sorted(glob.glob("/usr/local/share/ca-certificates/*.crt"))},
                   handle, default_flow_style=False)
EOF

# FLEET_RUNS="plan converge" runs only those (debugging; the assertions then fail for the rest).
runs=" ${FLEET_RUNS:-storage driver converge rerun alone tp2} "
play() {  # play [--may-fail] <name> [ansible-playbook args...]: one run, its log, its record
  local may_fail=false
  if [ "$1" = --may-fail ]; then may_fail=true; shift; fi
  local name=$1; shift
  [[ "$runs" == *" $name "* ]] || return 0
  local start; start=$(date +%s)
  if ! ansible-playbook -i inventories/example -i "$state/inventory.yml" -e "@$state/machine.yml" \
       -l 'kvcache_nodes:kvcache_router' \
       -e "fleet_record_file=$state/record-$name.json" \
       "$@" "$fleet_dir/playbooks/record.yml" >"$logs/$name.log" 2>&1; then
    if $may_fail; then
      echo "    $name: FAILED (allowed; the tests say what it could not publish):"
      grep -E '^\[ERROR\]: Task failed' "$logs/$name.log" | sort -u | sed 's/^/      /' | head -5
    else
      tail -n 60 "$logs/$name.log"
      echo "fleet: run '$name' failed (log: build/fleet/logs/$name.log)" >&2
      exit 1
    fi
  fi
  grep -A10 '^PLAY RECAP' "$logs/$name.log" | grep ' ok=' | sed 's/^/    /'
  echo "    $name: $(( $(date +%s) - start )) s"
}

together() {  # together "<play args>" "<play args>": two independent runs side by side (their
  # waits on the containers overlap); each one's output printed after both, and any failure fails.
  local out_a="$state/.together-a" out_b="$state/.together-b" pid_a pid_b rc_a=0 rc_b=0
  eval "play $1" >"$out_a" 2>&1 & pid_a=$!
  eval "play $2" >"$out_b" 2>&1 & pid_b=$!
  wait "$pid_a" || rc_a=$?
  wait "$pid_b" || rc_b=$?
  cat "$out_a" "$out_b"; rm -f "$out_a" "$out_b"
  [ "$rc_a" = 0 ] && [ "$rc_b" = 0 ] || exit 1
}

nvidia_double() {  # nvidia_double add|remove: the double of NVIDIA's repository on the nodes,
  # for host preparation's check-mode run only (tests/integration/fleet/fixtures/nvidia-repo):
  # cuda-keyring's source and keyring, the lists `apt-get update` would have fetched, and the
  # installed driver's nvidia-persistenced unit. Removed right after that run: the real runs
  # refresh apt's lists, and NVIDIA's host does not resolve here.
  local h c lists=/var/lib/apt/lists/developer.download.nvidia.com_compute_cuda_repos_debian12_x86%5f64
  for h in "${nodes[@]}"; do
    c=$(container "$h")
    if [ "$1" = add ]; then
      docker cp "$fleet_dir/fixtures/nvidia-repo/cuda-debian12-x86_64.list" "$c:/etc/apt/sources.list.d/cuda-debian12-x86_64.list"
      docker cp "$fleet_dir/fixtures/nvidia-repo/Packages" "$c:${lists}_Packages"
      docker cp "$fleet_dir/fixtures/nvidia-repo/InRelease" "$c:${lists}_InRelease"
      docker cp "$here/tests/unit/fixtures/nvidia_persistenced/ubuntu-nvidia-persistenced.service" \
        "$c:/lib/systemd/system/nvidia-persistenced.service"
      docker exec "$c" sh -c 'mkdir -p /usr/share/keyrings &&
        echo "fleet double: no key" >/usr/share/keyrings/cuda-archive-keyring.gpg && systemctl daemon-reload'
    else
      docker exec "$c" sh -c "rm -rf /etc/apt/sources.list.d/cuda-debian12-x86_64.list /usr/share/keyrings/cuda-archive-keyring.gpg \
        '${lists}_Packages' '${lists}_InRelease' /lib/systemd/system/nvidia-persistenced.service \
        /etc/systemd/system/nvidia-persistenced.service.d && systemctl daemon-reload"
    fi
  done
}

snapshot() {  # snapshot <phase>: what the nodes hold now, for tests/integration/fleet
  local phase=$1 h c d
  [[ "$runs" == *" $phase "* ]] || return 0
  for h in "${nodes[@]}"; do
    c=$(container "$h"); d="$state/state-$phase/$h"
    rm -rf "$d"; mkdir -p "$d"
    docker exec "$c" tar -C / --exclude=etc/kvcache/vllm/api-key.env -cf - etc/kvcache | tar -C "$d" -xf -
    docker exec "$c" sh -c 'echo "uid=$(id -u kvcache) gid=$(getent group kvcache | cut -d: -f3)"' >"$d/ids"
    docker exec "$c" getent passwd >"$d/passwd"
    docker exec "$c" grep MemTotal /proc/meminfo >"$d/meminfo"
    docker exec "$c" sh -c 'for f in /etc/kvcache/vllm/*.env; do n=$(basename "$f" .env); [ "$n" = api-key ] && continue
        echo "kvcache-vllm@$n.service $(systemctl is-active "kvcache-vllm@$n.service")"; done' >"$d/units"
    docker exec "$c" sh -c 'systemctl cat nvidia-persistenced.service 2>/dev/null || true' >"$d/persistenced"
    docker exec "$c" sh -c 'echo "$(systemctl is-enabled kvcache-lmcache.service 2>&1 || true)" \
        "$(systemctl is-active kvcache-lmcache.service || true)"' >"$d/lmcache_unit"
  done
}

fleet=(-e '{"vllm_start_instances": false}')

# Storage in check mode, on the nodes (the ONTAP play on the controller is limited out: it
# has its own tests against the strict API double, make integration). This build machine's
# kernel has no loadable modules (no /proc/modules), so loading rpcrdma cannot even be
# probed: this run alone passes kvcache_mount_load_rpcrdma=false (the role's knob for a
# kernel with rpcrdma built in) and goes on to the mount, which check mode plans (the fstab
# entry) without mount.nfs4; the role publishes kvcache_mount_facts, which the tests assert.
# Host preparation in check mode (with --diff: the drop-in it would write is in the log): the
# driver role plans against the replayed nvidia-smi and publishes nvidia_driver_facts. NVIDIA's
# repository is not reachable from here; the double above stands in for what a host with
# cuda-keyring and the R580 driver has (the role's "reuse the host's source" and "already on
# the branch" paths).
# Both are check mode and change nothing: they run side by side.
nvidia_double add
say "storage (check mode: no ONTAP, no NFS client or kernel modules here) and driver: host preparation (check mode: no GPU, no NVIDIA repository here), side by side"
together "storage --check \"\${fleet[@]}\" -e '{\"kvcache_mount_load_rpcrdma\": false}' playbooks/storage.yml" \
  "driver --check --diff \"\${fleet[@]}\" playbooks/host_prep.yml"
nvidia_double remove
# operations.yml is left out: its pruning timer needs the mounted tier (see storage above).
say "converge: preflight, nodes, monitoring (real)"
play converge "${fleet[@]}" playbooks/preflight.yml playbooks/nodes.yml \
  "$fleet_dir/playbooks/monitoring.yml"
snapshot converge
# The rerun (which must change nothing) and the router play alone (check mode, a run of its
# own without the nodes' play: what it derives comes from the nodes' GPUs) side by side. The
# example's router is the default, vllm_router, which waits at its start for its workers to
# answer: the engines never start here, so its play runs in check mode.
say "rerun (must change nothing) and router and monitoring alone, without the nodes' play (check mode: the engines never start), side by side"
together "rerun \"\${fleet[@]}\" playbooks/preflight.yml playbooks/nodes.yml \"\$fleet_dir/playbooks/monitoring.yml\"" \
  "alone --check \"\${fleet[@]}\" playbooks/router.yml \"\$fleet_dir/playbooks/monitoring.yml\""
say "converge at kvcache_tensor_parallel_size=2"
play tp2 "${fleet[@]}" -e '{"kvcache_tensor_parallel_size": 2}' playbooks/preflight.yml playbooks/nodes.yml \
  "$fleet_dir/playbooks/monitoring.yml"
snapshot tp2
say "runs done ($(elapsed)); assertions"
[ -z "${FLEET_RUNS:-}" ] || exit 0
python -m pytest tests/integration/fleet -q -p no:cacheprovider -o testpaths=tests/integration/fleet
say "passed ($(elapsed))"
