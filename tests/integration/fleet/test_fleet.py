"""inventories/example, as shipped, converged on the GPU-shaped fleet (issue #18): what the
roles rendered and published, read back from the nodes (build/fleet/state-*) and from the
runs' records and logs (scripts/fleet-test.sh writes them; `make fleet`)."""
import json
import math
import os
import re
import sys

import pytest
import yaml

from conftest import EXAMPLE, NODES, instance_envs, log, read_env, recap, record, state_dir

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "plugins", "filter"))
import kv_sizing  # noqa: E402  (the collection's filter, importable without Ansible)

with open(os.path.join(EXAMPLE, "group_vars", "kvcache_nodes", "engines.yml")) as _handle:
    ENGINES = yaml.safe_load(_handle)
with open(os.path.join(EXAMPLE, "group_vars", "all", "kvcache.yml")) as _handle:
    FLEET = yaml.safe_load(_handle)

with open(os.path.join(EXAMPLE, "group_vars", "all", "storage.yml")) as _handle:
    STORAGE = yaml.safe_load(_handle)
# The options the example's settings give (docs/roles/kvcache_mount.md: the seed's options with
# NetApp's RDMA transfer size, then nosuid,nodev,noexec: the tier holds data only); every one
# known to the nodes' kernel (this machine's, >= 5.18).
EXAMPLE_MOUNT_OPTIONS = "vers=4.1,proto=rdma,sec=sys,trunkdiscovery,write=eager,rsize=65536,wsize=65536,nosuid,nodev,noexec"

# (phase, tensor-parallel size): the example's own TP, then the converge with -e TP=2.
PHASES = [("converge", int(FLEET["kvcache_tensor_parallel_size"])), ("tp2", 2)]


def expected_instances(node, tp):
    """The vllm role's rule (docs/roles/vllm.md): GPU count // TP instances, ports from 8000."""
    count = NODES[node]["gpus"] // tp
    return {"gpu%d" % (i * tp): {"port": 8000 + i, "gpus": list(range(i * tp, (i + 1) * tp))} for i in range(count)}


def test_example_inventory_is_as_shipped():
    """The harness adds no role variable: the example has no vllm_instances, TP 1."""
    for root, _dirs, files in os.walk(EXAMPLE):
        for name in files:
            with open(os.path.join(root, name)) as handle:
                text = handle.read()
            assert not re.search(r"^\s*vllm_instances\s*:", text, re.M), os.path.join(root, name)
    assert FLEET["kvcache_tensor_parallel_size"] == 1
    with open(os.path.join(os.path.dirname(EXAMPLE), "..", "build", "fleet", "inventory.yml")) as handle:
        overlay = yaml.safe_load(handle)["all"]
    allowed_host = {"ansible_host", "ansible_docker_host", "ansible_connection", "ansible_python_interpreter"}
    for group in overlay["children"].values():
        for hostvars in group["hosts"].values():
            assert set(hostvars) <= allowed_host, hostvars
    # Only the vault's variables, as vault.yml.example names them (the documented edit: fill in).
    with open(os.path.join(EXAMPLE, "group_vars", "all", "vault.yml.example")) as handle:
        vault_names = set(yaml.safe_load(handle))
    assert vault_names and all(name.startswith("vault_") for name in vault_names), vault_names
    assert set(overlay["vars"]) <= vault_names, sorted(set(overlay["vars"]) - vault_names)
    with open(os.path.join(os.path.dirname(EXAMPLE), "..", "build", "fleet", "machine.yml")) as handle:
        assert set(yaml.safe_load(handle)) <= {"ca_trust_certificates"}


@pytest.mark.parametrize("phase,tp", PHASES)
@pytest.mark.parametrize("node", sorted(NODES))
def test_instances_derived_from_the_gpus(phase, tp, node):
    envs = instance_envs(phase, node)
    want = expected_instances(node, tp)
    assert sorted(envs) == sorted(want), "%s at TP %d: instances %s" % (node, tp, sorted(envs))
    for name, env in envs.items():
        args = env["VLLM_ARGS"].split()
        assert args[args.index("--port") + 1] == str(want[name]["port"]), (node, name)
        assert args[args.index("--tensor-parallel-size") + 1] == str(tp), (node, name)
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(str(g) for g in want[name]["gpus"]), (node, name)
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID", (node, name)
    # every GPU in exactly one instance (none left idle when TP divides the count)
    used = sorted(int(g) for env in envs.values() for g in env["CUDA_VISIBLE_DEVICES"].split(","))
    assert used == list(range(NODES[node]["gpus"] // tp * tp))


@pytest.mark.parametrize("phase", [p for p, _tp in PHASES])
@pytest.mark.parametrize("node", sorted(NODES))
def test_instances_installed_not_started(phase, node):
    with open(os.path.join(state_dir(phase, node), "units")) as handle:
        units = dict(line.split() for line in handle if line.strip())
    assert sorted(units) == sorted("kvcache-vllm@%s.service" % name for name in instance_envs(phase, node)), units
    assert set(units.values()) == {"inactive"}, units


@pytest.mark.parametrize("phase,tp", PHASES)
@pytest.mark.parametrize("node", sorted(NODES))
def test_lmcache_server_sized_from_the_nodes_instances(phase, tp, node):
    """LMCache's multiprocess mode (the default, issue #21 item 3): one server per node, its L1
    (CPU RAM) the node's fraction of RAM for all its engines together (never a per-worker share
    that adds up past it), and one store/retrieve thread per LMCache worker (TP rank) of the
    node's derived instances, so its engines do not queue on LMCache's default single thread."""
    base = state_dir(phase, node)
    assert not os.path.exists(os.path.join(base, "etc", "kvcache", "lmcache-config.yaml")), \
        "%s: an in-process lmcache-config.yaml in multiprocess mode" % node
    args = read_env(os.path.join(base, "etc", "kvcache", "lmcache-server.env"))["LMCACHE_SERVER_ARGS"].split()
    with open(os.path.join(base, "meminfo")) as handle:
        mem_kb = int(handle.read().split()[1])
    fraction = float(ENGINES["lmcache_cpu_ram_fraction"])
    workers = (NODES[node]["gpus"] // tp) * tp
    node_gb = math.floor(mem_kb // 1024 / 1024 * fraction * 10) / 10
    assert float(args[args.index("--l1-size-gb") + 1]) == pytest.approx(node_gb), (node, tp, args)
    assert float(args[args.index("--l1-size-gb") + 1]) <= fraction * mem_kb / 1024 / 1024 + 1e-9
    assert int(args[args.index("--max-gpu-workers") + 1]) == workers, (node, tp, args)
    # The chunk size is derived (the example sets none): the model's config.json on the node at the
    # run's TP size, the smallest chunk whose object is on the fs tier's plateau (32 MiB): Llama-3.1-8B
    # 256 tokens at TP 1 (32 MiB), 512 at TP 2 (4 KV heads per worker: 16 MiB per 256 tokens).
    assert "kvcache_chunk_size" not in FLEET
    assert int(args[args.index("--chunk-size") + 1]) == {1: 256, 2: 512}[tp], (node, tp, args)
    with open(os.path.join(os.path.dirname(__file__), "fixtures", "model", "config.json")) as handle:
        model = json.load(handle)
    assert kv_sizing.kv_chunk_size(model, "fs", None, tp) == {1: 256, 2: 512}[tp]
    assert args[args.index("--host") + 1] == "127.0.0.1" and args[args.index("--http-host") + 1] == "127.0.0.1", args
    # Object names the fleet's hash seed makes (vLLM's sha256_cbor from a seeded NONE_HASH), not LMCache 0.5.6's
    # default blake3, which starts every chain from a constant whatever PYTHONHASHSEED is.
    assert args[args.index("--hash-algorithm") + 1] == "sha256_cbor", args


@pytest.mark.parametrize("phase", [p for p, _tp in PHASES])
@pytest.mark.parametrize("node", sorted(NODES))
def test_lmcache_server_installed_not_started(phase, node):
    """With vllm_start_instances false the server follows the engines (lmcache_start_server):
    installed, neither enabled nor started (its L1 would be allocated up front on a node that
    serves nothing)."""
    with open(os.path.join(state_dir(phase, node), "lmcache_unit")) as handle:
        enabled, active = handle.read().split()
    assert (enabled, active) == ("disabled", "inactive"), (node, enabled, active)


def test_service_ids_identical_although_next_free_system_uid_differs():
    ids = {}
    for node in NODES:
        with open(os.path.join(state_dir("converge", node), "ids")) as handle:
            ids[node] = handle.read().strip()
    assert len(set(ids.values())) == 1, ids
    # The harness made gpu-a02's next free system UID differ (one more system account first):
    # without a pinned UID the nodes would disagree.
    with open(os.path.join(state_dir("converge", "gpu-a02"), "passwd")) as handle:
        assert any(line.startswith("fleet-other:") for line in handle)
    with open(os.path.join(state_dir("converge", "gpu-a01"), "passwd")) as handle:
        assert not any(line.startswith("fleet-other:") for line in handle)


def _urls(backends):
    return sorted(b["url"] for b in backends)


def _expected_urls(tp, port_sep=":"):
    return sorted("http://%s%s%d" % (NODES[n]["address"], port_sep, i["port"])
                  for n in NODES for i in expected_instances(n, tp).values())


@pytest.mark.parametrize("run,tp", [("converge", 1), ("rerun", 1), ("tp2", 2)])
def test_router_backends_list_every_derived_instance(run, tp):
    """The router's checks (preflight, in every run) compute the backends from the nodes."""
    backends = record(run)["routers"]["router-01"]["backends"]
    assert backends, "router-01 computed no backend in run %s" % run
    assert _urls(backends) == _expected_urls(tp)
    assert {b["model"] for b in backends} == {FLEET["kvcache_served_model_name"]}


def test_router_play_alone_derives_the_instances():
    """playbooks/router.yml alone (no nodes play in the run): the role reads the nodes' GPUs
    (delegated gpu_facts) and derives the same backends; never an empty list."""
    rec = record("alone")
    assert _urls(rec["routers"]["router-01"]["backends"]) == _expected_urls(1)
    assert all(rec["nodes"][n]["vllm_effective_instances"] is None for n in NODES)
    assert {n: rec["nodes"][n]["gpu_facts_count"] for n in NODES} == {n: NODES[n]["gpus"] for n in NODES}


@pytest.mark.parametrize("run,tp", [("converge", 1), ("alone", 1), ("tp2", 2)])
def test_prometheus_targets_list_every_derived_instance(run, tp):
    targets = record(run)["observability"]["targets"]["vllm"]
    got = sorted("http://%s" % t for group in targets for t in group["targets"])
    assert got == _expected_urls(tp)
    assert sorted({g["labels"]["kvcache_node"] for g in targets}) == sorted(NODES)


@pytest.mark.parametrize("run", ["converge", "tp2"])
def test_published_instances(run):
    rec = record(run)
    tp = 2 if run == "tp2" else 1
    for node in NODES:
        published = {i["name"]: {"port": int(i["port"]), "gpus": [int(g) for g in i["gpus"]]}
                     for i in rec["nodes"][node]["vllm_effective_instances"]}
        assert published == expected_instances(node, tp)


def driver_facts(node):
    """The driver role's published facts from the host preparation run (check mode, with the
    double of NVIDIA's repository and the driver's persistenced unit: fixtures/nvidia-repo)."""
    rec = record("driver")
    facts = rec["nodes"][node]["nvidia_driver_facts"]
    assert facts, "%s: host preparation published no nvidia_driver_facts (build/fleet/logs/driver.log)" % node
    return rec, facts


def task_results(text, task):
    """{host: the output of that host's result} for the task named `task` (first run of it)."""
    parts = text.split("TASK [%s]" % task, 1)
    assert len(parts) == 2, "no task %r in the log" % task
    body, results, buffer = parts[1].split("\nTASK [", 1)[0], {}, []
    for line in body.splitlines():
        buffer.append(line)
        found = re.match(r"^(ok|changed|skipping|fatal): \[([^\]]+)\]", line)
        if found:
            results[found.group(2)] = (found.group(1), "\n".join(buffer))
            buffer = []
    return results


@pytest.mark.parametrize("node", sorted(NODES))
def test_gpu_facts_see_the_nvswitches_only_on_the_hgx_node(node):
    rec = record("converge")
    assert rec["nodes"][node]["gpu_facts_count"] == NODES[node]["gpus"]
    assert rec["nodes"][node]["gpu_facts_nvswitch"] is NODES[node]["nvswitch"]


@pytest.mark.parametrize("node", sorted(NODES))
def test_fabric_manager_only_on_the_nvswitch_node(node):
    """Read from the driver role's published facts, not from its task names."""
    rec, facts = driver_facts(node)
    assert str(facts["on_branch"]).lower() == "true", facts  # the captures' 580.95.05 on the example's branch
    assert bool(facts["fabricmanager"]) is NODES[node]["nvswitch"], facts
    if NODES[node]["nvswitch"]:
        package = str(facts["fabricmanager_package"])
        # pinned to exactly the driver's version (the one nvidia-smi reports here)
        assert package.startswith("nvidia-fabricmanager-580="), package
        assert rec["nodes"][node]["gpu_facts_driver_version"] in package, package
    else:
        assert not facts["fabricmanager_package"], facts
    # and the install it planned (check-mode apt against the repository double) is that package
    installs = task_results(log("driver"), "kvcache.offload.nvidia_driver : Install Fabric Manager")
    if NODES[node]["nvswitch"]:
        assert installs[node][0] == "changed", installs
    else:  # the task never ran there (its include was skipped)
        assert installs.get(node, ("skipping",))[0] == "skipping", installs


@pytest.mark.parametrize("node", sorted(NODES))
def test_dcgm_exporter_planned_on_every_gpu_node(node):
    """Issue #37 item 4: NVIDIA's DCGM exporter (kvcache_dcgm_exporter, on in the example) from
    NVIDIA's repository (the repository double's packages, check-mode apt), bound by a drop-in to
    the node's address at the fleet's port 9450 (from the run's diff); the units it would bring are
    not started in check mode. The exporter itself cannot run without a GPU (molecule nvidia_driver
    runs the role's service handling against a test double of the binary)."""
    _rec, facts = driver_facts(node)
    listen = "%s:9450" % NODES[node]["address"]
    assert facts["dcgm_exporter"]["listen"] == listen, facts
    assert facts["dcgm_exporter"]["packages"] == ["datacenter-gpu-manager-4-core", "datacenter-gpu-manager-exporter"]
    text = log("driver")
    status, output = task_results(text, "kvcache.offload.nvidia_driver : Install DCGM and its exporter")[node]
    assert status == "changed", output
    status, output = task_results(
        text, "kvcache.offload.nvidia_driver : Bind the exporter to the node's internal address and the fleet's port")[node]
    assert status == "changed", output
    added = [line[1:].strip() for line in output.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert "ExecStart=" in added and (
        "ExecStart=/usr/bin/dcgm-exporter -f /etc/dcgm-exporter/default-counters.csv -a %s" % listen) in added, output
    started = task_results(text, "kvcache.offload.nvidia_driver : Start the exporter (restarted on a new command line), "
                                 "at every boot")
    assert started[node][0] == "skipping", started


@pytest.mark.parametrize("run", ["converge", "tp2"])
def test_prometheus_scrapes_every_nodes_dcgm_exporter(run):
    targets = record(run)["observability"]["targets"]["dcgm"]
    assert sorted(t for group in targets for t in group["targets"]) == sorted(
        "%s:9450" % NODES[n]["address"] for n in NODES)


@pytest.mark.parametrize("node", sorted(NODES))
def test_persistence_mode_on(node):
    """nvidia-persistenced with persistence mode on: the drop-in the role would write over the
    installed unit (Ubuntu's, which passes --no-persistence-mode), from the check-mode run's diff,
    and the restart it plans. The daemon itself cannot run without a GPU."""
    _rec, facts = driver_facts(node)
    assert str(facts["persistence_mode"]).lower() == "true", facts
    assert facts["persistenced_dropin"] == "/etc/systemd/system/nvidia-persistenced.service.d/kvcache-persistence-mode.conf"
    text = log("driver")
    status, output = task_results(
        text, "kvcache.offload.nvidia_driver : Override the persistence daemon's command line (persistence mode on)")[node]
    assert status == "changed", output
    added = [line[1:].strip() for line in output.splitlines() if line.startswith("+") and not line.startswith("+++")]
    exec_lines = [line for line in added if line.startswith("ExecStart=")]
    # ExecStart= cleared, then the daemon without --no-persistence-mode (its default: persistence on)
    assert exec_lines[:1] == ["ExecStart="], output
    assert len(exec_lines) == 2 and exec_lines[1].startswith("ExecStart=/usr/bin/nvidia-persistenced"), output
    assert "--no-persistence-mode" not in exec_lines[1], output
    restart = task_results(text, "kvcache.offload.nvidia_driver : Restart the persistence daemon on its new command line")
    assert restart[node][0] == "changed", restart


@pytest.mark.parametrize("node", sorted(NODES))
def test_storage_stage_plans_the_nfs_mount(node):
    """The storage run (check mode) reaches the mount and plans the fstab entry for the example's
    export on every node; the role publishes what it mounts (kvcache_mount_facts). mount.nfs4
    cannot run here (no NFS/RDMA client in this kernel), and rpcrdma's loading is skipped
    (no loadable modules: the run passes kvcache_mount_load_rpcrdma=false, docs/lab.md)."""
    text = log("storage")
    hosts = recap(text)
    assert all(c["failed"] == 0 for c in hosts.values()), hosts
    facts = record("storage")["nodes"][node]["kvcache_mount_facts"]
    assert facts, "%s published no kvcache_mount_facts" % node
    assert facts["type"] == "nfs"
    assert facts["source"] == "%s:%s" % (STORAGE["kvcache_mount_server"], STORAGE["kvcache_mount_export"])
    assert facts["path"] == FLEET["kvcache_fs_path"]
    assert facts["options"] == EXAMPLE_MOUNT_OPTIONS
    # the mount task itself ran and would write the entry (check mode: changed, nothing written)
    block = text.split("TASK [kvcache.offload.kvcache_mount : Mount the export, persistent across reboots]", 1)
    assert len(block) == 2, "the storage run never reached the mount"
    assert re.search(r"^changed: \[%s\]" % re.escape(node), block[1].split("TASK [", 1)[0], re.M), block[1][:2000]
    # and preflight's kernel check let these options through on this kernel
    assert "Fail on a mount option the node's kernel does not know" in text


def changed_tasks(text):
    """[(task, result line)] of every change a run reported, but the harness's own record."""
    changed, task = [], None
    for line in text.splitlines():
        if line.startswith("TASK ["):
            task = line[len("TASK ["):line.rfind("]")]
        elif line.startswith("changed: ") and task != "Write the record":
            changed.append((task, line))
    return changed


def test_second_run_changes_nothing():
    text = log("rerun")
    hosts = recap(text)
    assert changed_tasks(text) == []
    record_writes = len([t for t in re.findall(r"^TASK \[(.*)\]", text, re.M) if t == "Write the record"])
    assert sum(c["changed"] for c in hosts.values()) <= record_writes, hosts
    assert all(c["failed"] == 0 and c.get("unreachable", 0) == 0 for c in hosts.values())
