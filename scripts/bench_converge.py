# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Converge benchmark for scripts/bench.py: no-op reruns of the node-side playbooks on N
simulated nodes, and the full-stack lab rerun when the lab is up.

Simulated nodes are systemd containers made from the local image on their OWN docker
network (kvcache-sim, 172.29.110.0/24) with their own names (kvcache-sim-nodeNN); the
lab's containers, network and build/lab are never touched. Each node gets the engine
"installed but not started" (vllm_start_instances: false, a real production knob).

Shortcut (documented in docs/benchmarks.md): the ~3 GB engine venv and the tiny model are
built once, by a real run of playbooks/nodes.yml on a seed container
(kvcache-sim-seed) whose venv and model directories are host directories under
build/bench/sim; every simulated node mounts them read-only at the same paths, so
inference_env finds the venv built from the same lock and skips the install. The measured
runs are unmodified ansible-playbook runs of the collection's playbooks.
"""

import contextlib
import fcntl
import glob
import json
import os
import re
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import time

import bench_common

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

SIM_NETWORK = "kvcache-sim"
SIM_SUBNET = "172.29.110.0/24"
SIM_GATEWAY = "172.29.110.1"
SIM_PREFIX = "kvcache-sim-"
SIM_LABEL = "kvcache.offload.bench=converge-sim"
SIM_IMAGE = "kvcache-offload/debian12-systemd:current"
SEED_ADDRESS = "172.29.110.250"
MAX_NODES = 200
VENV_PATH = "/opt/kvcache/venv"
MODELS_PATH = "/opt/kvcache/models"
UV_CACHE_PATH = "/var/cache/kvcache/uv"
TIER_PATH = "/mnt/kvcache"
# The node-side stages of site.yml, in its order (router.yml and validate.yml need a router
# and running engines; the router play matches no host here).
NODE_PLAYBOOKS = ("playbooks/preflight.yml", "playbooks/host_prep.yml", "playbooks/storage.yml",
                  "playbooks/nodes.yml")
SEED_PLAYBOOKS = ("playbooks/nodes.yml",)
LAB_CONTAINERS = ("kvcache-lab-node1", "kvcache-lab-node2", "kvcache-lab-router", "kvcache-lab-s3")
LAB_LOCK = "/tmp/kvcache-lab.lock"
TARGET_RATIO = 4.0
# The kernel's per-user limit of inotify instances counts every container's systemd, journald,
# logind and dbus (7 per idle node, measured; ansible's systemctl calls add more while a run
# goes). Debian's default of 128 stopped the 23rd of 32 nodes from booting here.
INOTIFY_SYSCTL = "/proc/sys/fs/inotify/max_user_instances"
INOTIFY_PER_CONTAINER = 16
INOTIFY_RESERVE = 64
TARGET_LAB_SECONDS = 60.0
PROC_STAT = "/proc/stat"


def log(message):
    sys.stderr.write("[bench %s] converge: %s\n" % (time.strftime("%H:%M:%S"), message))
    sys.stderr.flush()


# ---------------------------------------------------------------------------------------------
# pure helpers (unit-tested)

def cpu_busy_seconds(stat_text, ticks_per_second):
    """Busy CPU seconds of the whole machine from /proc/stat's aggregate "cpu" line: user, nice,
    system, irq and softirq (guest time is already inside user). Idle, iowait and steal (time
    the hypervisor gave to someone else) are not work done here."""
    for line in stat_text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            values = [int(v) for v in fields[1:]] + [0] * 8
            user, nice, system, _idle, _iowait, irq, softirq = values[:7]
            return (user + nice + system + irq + softirq) / float(ticks_per_second)
    raise ValueError("no aggregate cpu line in /proc/stat")


def machine_cpu_seconds(path=PROC_STAT):
    """Busy CPU seconds of the machine so far (None where /proc/stat cannot be read)."""
    try:
        with open(path) as handle:
            return cpu_busy_seconds(handle.read(), os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError):
        return None


# The lab rerun's own CPU (issue #24): other work on the machine (other helpers, CI jobs) also
# shows in /proc/stat, and the lab's services (idle engines, SeaweedFS) burn CPU for as long as
# a run lasts. So the rerun's CPU is summed from the processes it starts: the ansible-playbook
# process tree (getrusage: the controller, its forks, the docker clients) and what each lab
# container's containerd-shim reaped (every `docker exec` process is its child: the module runs
# and whatever they wait for, apt or systemctl; with the `runc` calls that start them). The
# containers' cgroups (those module runs again, plus the services) and dockerd/containerd
# (shared with every docker user on the machine) are reported beside it, not in it.
CGROUP_CPUACCT = "/sys/fs/cgroup/cpuacct/docker"
CGROUP_V2 = "/sys/fs/cgroup/system.slice"
DOCKER_DAEMONS = ("dockerd", "containerd")


def proc_stat_cpu_seconds(stat_text, ticks_per_second, children=True):
    """utime + stime (+ cutime + cstime: reaped children such as runc) of one /proc/<pid>/stat."""
    fields = stat_text[stat_text.rindex(")") + 2:].split()
    # fields[0] is the state (field 3); utime is field 14, so index 11
    values = [int(v) for v in fields[11:15]]
    used = values[0] + values[1] + ((values[2] + values[3]) if children else 0)
    return used / float(ticks_per_second)


def _read_text(path):
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return None


def container_cgroup_cpu_seconds(container_id, root=None, v2_root=None):
    """CPU seconds a container's cgroup has used (cgroup v1 cpuacct.usage or v2 cpu.stat), or None."""
    root, v2_root = root or CGROUP_CPUACCT, v2_root or CGROUP_V2
    text = _read_text(os.path.join(root, container_id, "cpuacct.usage"))
    if text is not None:
        return int(text.strip()) / 1e9
    text = _read_text(os.path.join(v2_root, "docker-%s.scope" % container_id, "cpu.stat"))
    for line in (text or "").splitlines():
        key, _sep, value = line.partition(" ")
        if key == "usage_usec":
            return int(value) / 1e6
    return None


def _processes(proc="/proc"):
    """[(pid, comm, cmdline, stat text)] of the running processes (those that vanish are skipped)."""
    out = []
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        base = os.path.join(proc, entry)
        stat, cmdline = _read_text(os.path.join(base, "stat")), _read_text(os.path.join(base, "cmdline"))
        if stat is None or cmdline is None:
            continue
        out.append((int(entry), stat[stat.index("(") + 1:stat.rindex(")")], cmdline.replace("\0", " ").strip(), stat))
    return out


def lab_container_ids(names=LAB_CONTAINERS):
    """{container name: full id} of the running lab containers."""
    out = _docker(["inspect", "--format", "{{.Name}} {{.Id}}"] + list(names), check=False)
    ids = {}
    for line in out.splitlines():
        parts = line.strip().lstrip("/").split()
        if len(parts) == 2 and parts[0] in names:
            ids[parts[0]] = parts[1]
    return ids


def lab_cpu_snapshot(container_ids, proc="/proc", ticks=None):
    """CPU seconds used so far by each lab container's cgroup and shim, and by the docker daemons."""
    ticks = ticks or os.sysconf("SC_CLK_TCK")
    snap = {"containers": {}, "shims": {}, "daemons": {}}
    for name, cid in container_ids.items():
        snap["containers"][name] = container_cgroup_cpu_seconds(cid)
    by_id = {cid: name for name, cid in container_ids.items()}
    for _pid, comm, cmdline, stat in _processes(proc):
        if comm.startswith("containerd-shim"):
            args = cmdline.split()
            if "-id" in args and args.index("-id") + 1 < len(args) and args[args.index("-id") + 1] in by_id:
                snap["shims"][by_id[args[args.index("-id") + 1]]] = proc_stat_cpu_seconds(stat, ticks)
        elif comm in DOCKER_DAEMONS:
            snap["daemons"][comm] = snap["daemons"].get(comm, 0.0) + proc_stat_cpu_seconds(stat, ticks)
    return snap


def lab_cpu_delta(before, after, controller_cpu):
    """The rerun's own CPU from two lab_cpu_snapshot()s and the ansible process tree's CPU.

    Returns {rerun_cpu_seconds: controller + shims, controller: s, shims: s (what the lab's shims
    and the processes they reaped used: the docker exec'd module runs), containers: {name: s}
    (cgroups: the module runs again plus the services; not in the sum), daemons: s (dockerd +
    containerd, shared with every other docker user; not in the sum), complete: False when a
    container or shim could not be read}."""
    def delta(kind, name):
        b, a = before[kind].get(name), after[kind].get(name)
        return None if b is None or a is None else a - b
    names = sorted(after["containers"])
    containers = {name: delta("containers", name) for name in names}
    shims = [delta("shims", name) for name in names]
    daemons = [delta("daemons", name) for name in DOCKER_DAEMONS if name in after["daemons"]]
    complete = all(v is not None for v in containers.values()) and all(v is not None for v in shims)
    shim_total = sum(v for v in shims if v)
    return {"rerun_cpu_seconds": shim_total + (controller_cpu or 0.0), "controller": controller_cpu,
            "shims": shim_total, "containers": containers,
            "containers_total": sum(v for v in containers.values() if v),
            "daemons": sum(v for v in daemons if v is not None), "complete": complete}


def usable_cores():
    """CPUs this process may run on (its affinity), which is what the run's work had."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def cpu_floor(machine_cpu, cores):
    """The shortest wall time the same CPU work could take on `cores` CPUs, perfectly packed:
    busy CPU seconds / cores. A wall-time target below it is out of reach on this machine
    without less work per run."""
    if machine_cpu is None or not cores:
        return None
    return machine_cpu / float(cores)


def parse_nodes(text):
    """'2,8,32' -> [2, 8, 32] (sorted, unique); 'none' -> [] (no simulated nodes, only the lab
    rerun); raises ValueError outside 1..MAX_NODES."""
    if str(text).strip() == "none":
        return []
    counts = sorted({int(part) for part in str(text).split(",") if part.strip()})
    if not counts or counts[0] < 1 or counts[-1] > MAX_NODES:
        raise ValueError("node counts must be between 1 and %d: %r" % (MAX_NODES, text))
    return counts


def sim_hosts(count):
    """The simulated nodes: [{name, container, address}], addresses .11 upwards."""
    if not 1 <= count <= MAX_NODES:
        raise ValueError("1..%d nodes" % MAX_NODES)
    return [{"name": "sim-node%02d" % index, "container": "%snode%02d" % (SIM_PREFIX, index),
             "address": "172.29.110.%d" % (10 + index)} for index in range(1, count + 1)]


def seed_host():
    return {"name": "sim-seed", "container": SIM_PREFIX + "seed", "address": SEED_ADDRESS}


def node_vars(pip_sources, api_key, ca_certificates):
    """Variables of every simulated node: the lab's node settings (inventories/lab), with the
    engines installed but not started."""
    return {
        # LAB SUBSTITUTE (as in inventories/lab): containers over the docker connection.
        "ansible_connection": "community.docker.docker",
        "ansible_python_interpreter": "/usr/bin/python3",
        "kvcache_model": MODELS_PATH + "/tiny-qwen2",
        "kvcache_served_model_name": "tiny-qwen2",
        "kvcache_hash_seed": 123,
        "kvcache_hash_seed_allow_public": True,  # simulated nodes: nobody else writes their tier
        "kvcache_chunk_size": 256,
        "kvcache_tensor_parallel_size": 1,
        "kvcache_tier": "fs",
        "kvcache_fs_path": TIER_PATH,
        "kvcache_mount_type": "shared_dir",
        "kvcache_api_key": api_key,
        "ca_trust_certificates": list(ca_certificates),
        "inference_env_profile": "cpu",
        "inference_env_model_source": "tiny_random",
        "inference_env_find_links": list(pip_sources.get("find_links", [])),
        "inference_env_extra_index_urls": list(pip_sources.get("extra_index_urls", [])),
        "inference_env_index_strategy": "unsafe-best-match",
        "vllm_kv_connector": "example_shared_storage",
        "vllm_enforce_eager": True,
        "vllm_max_model_len": 8192,
        "vllm_extra_env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
        "vllm_extra_args": ["--max-num-batched-tokens", "8192"],
        "lmcache_max_local_cpu_size": 1,
        "vllm_instances": [{"name": "cpu0", "port": 8000}],
        # The production knob this benchmark is about: installed, configured, not started.
        "vllm_start_instances": False,
    }


def make_inventory(hosts, variables):
    """An inventory (dict, YAML-ready) with the hosts in kvcache_nodes and empty platform groups."""
    return {"all": {
        "vars": dict(variables),
        "children": {
            "kvcache_nodes": {"hosts": {h["name"]: {"ansible_host": h["address"],
                                                    "ansible_docker_host": h["container"]} for h in hosts}},
            "kvcache_router": {"hosts": {}},
            "kvcache_storage_controllers": {"hosts": {}},
            "kvcache_s3_store": {"hosts": {}},
        },
    }}


def docker_run_argv(host, image, volumes, network=SIM_NETWORK):
    """`docker run` arguments for one simulated node: systemd as PID 1, as playbooks/lab_up.yml
    makes the lab's."""
    argv = ["run", "--detach", "--name", host["container"], "--hostname", host["name"],
            "--label", SIM_LABEL, "--network", network, "--ip", host["address"],
            "--env", "container=docker", "--stop-signal", "SIGRTMIN+3", "--shm-size", "1g",
            "--tmpfs", "/run", "--tmpfs", "/run/lock", "--tmpfs", "/tmp",
            # NET_ADMIN: kvcache_firewall loads its nftables table in the node's network namespace.
            "--cap-add", "NET_ADMIN",
            "--volume", "/sys/fs/cgroup:/sys/fs/cgroup:ro"]
    for volume in volumes:
        argv += ["--volume", volume]
    return argv + [image, "/lib/systemd/systemd"]


def parse_profile_tasks(text, top=12):
    """The slowest tasks from the profile_tasks summary: [{task, seconds}] (largest first)."""
    rows = []
    pattern = re.compile(r"^(?P<task>.+?) -{2,} (?P<seconds>\d+\.\d+)s$")
    seen_summary = False
    for line in (text or "").splitlines():
        line = line.rstrip()
        if re.match(r"^=+\s*$", line):
            seen_summary = True
            rows = []
            continue
        match = pattern.match(line)
        if seen_summary and match:
            rows.append({"task": match.group("task").strip(), "seconds": float(match.group("seconds"))})
    rows.sort(key=lambda row: -row["seconds"])
    return rows[:top]


def summarize_targets(results, lab=None, ratio_target=TARGET_RATIO, lab_target=TARGET_LAB_SECONDS):
    """Targets of issue #9 from the per-N results ({nodes, rerun: {seconds, changed_total, rc}}):
    every rerun changed=0, rerun(max N) / rerun(min N) < ratio_target, lab rerun < lab_target s.
    A target that was not measured is None (never True)."""
    ok = [r for r in results if r.get("rerun") and r["rerun"].get("rc") == 0]
    by_n = {r["nodes"]: r["rerun"] for r in ok}
    out = {"changed_zero": None, "ratio": None, "ratio_nodes": None, "ratio_met": None,
           "ratio_target": ratio_target, "lab_seconds": None, "lab_met": None, "lab_changed_zero": None,
           "lab_target_seconds": lab_target, "lab_cpu_floor_seconds": None, "lab_reachable_here": None}
    reruns = [r.get("rerun") for r in results if r.get("rerun")]
    if reruns:
        out["changed_zero"] = all(r.get("rc") == 0 and r.get("changed_total") == 0 for r in reruns)
    if len(by_n) >= 2:
        low, high = min(by_n), max(by_n)
        if by_n[low]["seconds"]:
            out["ratio"] = by_n[high]["seconds"] / by_n[low]["seconds"]
            out["ratio_nodes"] = [low, high]
            out["ratio_met"] = out["ratio"] < ratio_target
    if lab and lab.get("rerun") and lab["rerun"].get("rc") == 0:
        out["lab_seconds"] = lab["rerun"]["seconds"]
        out["lab_met"] = lab["rerun"]["seconds"] < lab_target
        out["lab_changed_zero"] = lab["rerun"].get("changed_total") == 0
        floor = lab["rerun"].get("cpu_floor_seconds")
        if floor is not None:
            # Could the same work finish under the target on this machine at all?
            out["lab_cpu_floor_seconds"] = floor
            out["lab_reachable_here"] = floor < lab_target
    return out


def _verdict(value):
    return {True: "met", False: "NOT met", None: "not measured"}[value]


def _per_play_lines(runs):
    """Module runs per play (the order the plays ran): all hosts, and per node."""
    rows = [r for r in runs.get("per_play") or [] if r[1]]
    if not rows:
        return []
    lines = ["", "Module runs per play in that rerun (all hosts / per node):", "",
             "| play | module runs | per node |", "| --- | ---: | ---: |"]
    for play, count, per_node in rows:
        lines.append("| %s | %d | %s |" % (play.replace("|", "/"), count, "-" if per_node is None else "%.1f" % per_node))
    return lines


def render_markdown(conv):
    """The converge section of bench.md."""
    def sec(value):
        return "-" if value is None else "%.1f" % value

    lines = ["## Converge: no-op reruns", ""]
    if conv.get("skipped"):
        return lines + ["Skipped: %s." % conv.get("reason"), ""]
    lines.append("Simulated nodes: systemd containers on docker network `%s`, engines installed but not started "
                 "(`vllm_start_instances: false`); playbooks: %s. Shortcut: the engine venv and the tiny model "
                 "come from one seed run, mounted read-only into every node (docs/benchmarks.md). "
                 "forks=%s, pipelining=%s." % (SIM_NETWORK, ", ".join("`%s`" % p for p in conv.get("playbooks", [])),
                                               conv.get("forks"), conv.get("pipelining")))
    lines.append("")
    lines += ["| nodes | cold s | rerun s | rerun s/host | rerun controller CPU s/host | rerun machine CPU s "
              "| rerun CPU floor s | rerun module runs/node | rerun changed | rerun failed | load after | rc |",
              "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in conv.get("results", []):
        cold, rerun = r.get("cold") or {}, r.get("rerun") or {}
        lines.append("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["nodes"], sec(cold.get("seconds")), sec(rerun.get("seconds")),
            "-" if rerun.get("per_host_seconds") is None else "%.2f" % rerun["per_host_seconds"],
            "-" if rerun.get("controller_cpu_seconds_per_host") is None else "%.2f" % rerun["controller_cpu_seconds_per_host"],
            sec(rerun.get("machine_cpu_seconds")), sec(rerun.get("cpu_floor_seconds")),
            sec((rerun.get("module_runs") or {}).get("per_node")),
            rerun.get("changed_total", "-"), rerun.get("failed_total", "-"), rerun.get("loadavg_after", "-"),
            "cold %s / rerun %s" % (cold.get("rc", "-"), rerun.get("rc", "-"))))
        if r.get("error"):
            lines.append("| | error: %s | | | | | | | | | | |" % str(r["error"]).replace("|", "/")[:200])
    lab = conv.get("lab") or {}
    lines.append("")
    if lab.get("rerun"):
        rr = lab["rerun"]
        lines.append("Full-stack lab rerun (`ansible-playbook site.yml`, lab inventory): %.1f s, %d hosts, changed=%s, "
                     "rc %s, load after %s." % (rr["seconds"], rr["hosts"], rr.get("changed_total"), rr.get("rc"),
                                                rr.get("loadavg_after", "-")))
        runs = rr.get("module_runs") or {}
        if runs.get("total"):
            lines.append("")
            lines.append("Module runs (AnsiballZ starts, counted by scripts/bench_plugins/callback/module_runs.py): "
                         "%d in all, %s per node, %d on the controller; most: %s." % (
                             runs["total"], sec(runs.get("per_node")), runs.get("controller", 0),
                             ", ".join("%s %d" % (m, n) for m, n in runs.get("by_module", [])[:5])))
            lines += _per_play_lines(runs)
        if rr.get("machine_cpu_seconds") is not None:
            lines.append("")
            lines.append("The machine was busy for %.1f CPU-seconds during it (controller, docker, the module runs in "
                         "the containers, the lab's services) on %d usable cores: however well packed, the same work "
                         "takes at least %.1f s here (CPU floor)." % (
                             rr["machine_cpu_seconds"], rr.get("cores") or 0, rr.get("cpu_floor_seconds") or 0.0))
        own = rr.get("lab_cpu") or {}
        if own:
            lines.append("")
            lines.append("The rerun's own CPU (what it started, whatever else runs on the machine): %.1f CPU-seconds, "
                         "%.1f in ansible-playbook's process tree and %.1f in what the lab containers' shims reaped (the "
                         "docker exec'd module runs)%s; the containers' cgroups, with their services, %.1f; dockerd and "
                         "containerd (shared) %.1f." % (
                             own["rerun_cpu_seconds"], own.get("controller") or 0.0, own.get("shims") or 0.0,
                             ", under Mitogen" if conv.get("mitogen") else "", own.get("containers_total") or 0.0,
                             own.get("daemons") or 0.0))
    else:
        lines.append("Full-stack lab rerun: not measured (%s)." % lab.get("reason", "not asked"))
    t = conv.get("targets") or {}
    lines += ["", "Targets (reported, never asserted):", ""]
    lines.append("- every rerun reports changed=0: **%s**" % _verdict(t.get("changed_zero")))
    lines.append("- rerun(%s nodes) / rerun(%s nodes) < %.0fx: **%s** (%s)" % (
        (t.get("ratio_nodes") or ["max", "min"])[1], (t.get("ratio_nodes") or ["min", "max"])[0],
        t.get("ratio_target", TARGET_RATIO), _verdict(t.get("ratio_met")),
        "-" if t.get("ratio") is None else "%.2fx" % t["ratio"]))
    lines.append("- full-stack lab rerun < %.0f s: **%s** (%s)" % (
        t.get("lab_target_seconds", TARGET_LAB_SECONDS), _verdict(t.get("lab_met")), sec(t.get("lab_seconds"))))
    if t.get("lab_reachable_here") is False:
        lines.append("- the lab rerun's CPU floor on this machine (%.1f s) is above the %.0f s target: it cannot be met "
                     "here without less work per run; see docs/benchmarks.md" % (
                         t["lab_cpu_floor_seconds"], t.get("lab_target_seconds", TARGET_LAB_SECONDS)))
    if t.get("lab_changed_zero") is False:
        lines.append("- the lab rerun changed something (changed=%s)" % lab["rerun"].get("changed_total"))
    slow = [r for r in conv.get("results", []) if (r.get("rerun") or {}).get("slowest_tasks")]
    if slow:
        biggest = slow[-1]
        lines += ["", "Where the %d-node rerun goes (profile_tasks, slowest tasks):" % biggest["nodes"], ""]
        for row in biggest["rerun"]["slowest_tasks"][:8]:
            lines.append("- %.2f s %s" % (row["seconds"], row["task"]))
        runs = biggest["rerun"].get("module_runs") or {}
        if runs.get("by_task"):
            lines += ["", "Tasks with the most module runs in that rerun (all hosts):", ""]
            for task, count in runs["by_task"][:8]:
                lines.append("- %d %s" % (count, task))
        lines += _per_play_lines(runs)
    for note in conv.get("notes", []):
        lines.append("- %s" % note)
    lines.append("")
    return lines


# ---------------------------------------------------------------------------------------------
# docker and ansible (side effects)

def _docker(argv, timeout=120, check=True):
    proc = subprocess.run(["docker"] + list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=timeout, check=False)
    out = proc.stdout.decode("utf-8", errors="replace")
    if check and proc.returncode != 0:
        raise RuntimeError("docker %s failed (%d): %s" % (" ".join(argv[:3]), proc.returncode, out.strip()[-400:]))
    return out


def own_containers():
    """Names of the containers this benchmark made (by label AND name prefix)."""
    out = _docker(["ps", "-a", "--filter", "label=" + SIM_LABEL, "--format", "{{.Names}}"], check=False)
    return [name for name in out.split() if name.startswith(SIM_PREFIX)]


def teardown():
    """Remove every simulated node and the sim network (never anything of the lab)."""
    names = own_containers()
    if names:
        _docker(["rm", "--force", "--volumes"] + names, timeout=300, check=False)
    if _docker(["network", "ls", "--filter", "name=^%s$" % SIM_NETWORK, "--format", "{{.Name}}"],
               check=False).strip() == SIM_NETWORK:
        _docker(["network", "rm", SIM_NETWORK], check=False)


def _ensure_network():
    if _docker(["network", "ls", "--filter", "name=^%s$" % SIM_NETWORK, "--format", "{{.Name}}"],
               check=False).strip() != SIM_NETWORK:
        _docker(["network", "create", "--driver", "bridge", "--subnet", SIM_SUBNET, "--gateway", SIM_GATEWAY,
                 "--label", SIM_LABEL, SIM_NETWORK])


def inotify_instances_needed(containers, per_container=INOTIFY_PER_CONTAINER, reserve=INOTIFY_RESERVE):
    """fs.inotify.max_user_instances that `containers` systemd containers need, with headroom."""
    return int(containers) * per_container + reserve


def ensure_inotify_instances(containers, path=INOTIFY_SYSCTL):
    """Raise fs.inotify.max_user_instances when it is too low for `containers` systemd nodes.

    Returns a note for the report when it raised the limit, None when it was high enough;
    raises RuntimeError (naming the sysctl and the fix) when it is too low and cannot be raised.
    """
    needed = inotify_instances_needed(containers)
    with open(path, encoding="ascii") as handle:
        current = int(handle.read().strip())
    if current >= needed:
        return None
    try:
        with open(path, "w", encoding="ascii") as handle:
            handle.write("%d\n" % needed)
    except OSError as exc:
        raise RuntimeError(
            "fs.inotify.max_user_instances is %d; %d systemd containers need about %d (each holds about 7 "
            "inotify instances and the limit is per user). Fix: run `sysctl -w fs.inotify.max_user_instances=%d` "
            "as root, or ask for fewer --converge-nodes (%s)" % (current, containers, needed, needed, exc)) from exc
    return "raised fs.inotify.max_user_instances from %d to %d for %d systemd containers" % (current, needed, containers)


@contextlib.contextmanager
def inotify_instances_for(containers, path=INOTIFY_SYSCTL):
    """ensure_inotify_instances for the duration of the block (yields its note); a limit it
    raised is put back on exit, also after an error, so the bench leaves the kernel as it was."""
    with open(path, encoding="ascii") as handle:
        before = handle.read().strip()
    note = ensure_inotify_instances(containers, path)
    try:
        yield note
    finally:
        if note:
            with open(path, "w", encoding="ascii") as handle:
                handle.write("%s\n" % before)


def start_containers(hosts, image, volumes, boot_timeout=180):
    _ensure_network()
    for host in hosts:
        _docker(docker_run_argv(host, image, volumes))
    deadline = time.monotonic() + boot_timeout
    for host in hosts:
        while True:
            state = _docker(["exec", host["container"], "systemctl", "is-system-running"], check=False).strip()
            if state.splitlines() and state.splitlines()[-1] in ("running", "degraded"):
                break
            if time.monotonic() > deadline or "is not running" in state:
                logs = _docker(["logs", "--tail", "15", host["container"]], check=False).strip()
                raise RuntimeError("%s: systemd did not finish booting (%s); its last log lines: %s"
                                   % (host["container"], state, logs[-800:]))
            time.sleep(1)


def _write_inventory(path, inventory):
    import yaml
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write("# Generated by scripts/bench_converge.py for the converge benchmark; not for editing.\n")
        yaml.safe_dump(inventory, handle, default_flow_style=False, sort_keys=True)


def _pip_sources():
    proc = subprocess.run([sys.executable, os.path.join(HERE, "pip-sources.py")], stdout=subprocess.PIPE,
                          timeout=60, check=True)
    return json.loads(proc.stdout.decode())


def _playbook_argv(inventory, playbooks):
    return [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", inventory] + [
        os.path.join(ROOT, p) for p in playbooks]


def _ansible_settings():
    """forks and pipelining as the runs see them (ansible-config)."""
    exe = os.path.join(os.path.dirname(sys.executable), "ansible-config")
    out = {"forks": None, "pipelining": None}
    try:
        proc = subprocess.run([exe, "dump", "--only-changed", "--format", "json"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, timeout=60, check=False, cwd=ROOT)
        for item in json.loads(proc.stdout.decode() or "[]"):
            if item.get("name") == "DEFAULT_FORKS":
                out["forks"] = item.get("value")
            if item.get("name") == "ANSIBLE_PIPELINING":
                out["pipelining"] = item.get("value")
    except (OSError, ValueError, subprocess.TimeoutExpired):
        pass
    return out


def _timed(time_command, argv, label, log_path, timeout, env=None, lab_ids=None, cwd=ROOT):
    """Run one playbook command and measure it; with lab_ids ({container: id}) also the CPU of the
    lab's containers and their shims during it (lab_cpu_delta: the rerun's own CPU)."""
    runs_log = log_path + ".module-runs.jsonl"
    if os.path.exists(runs_log):
        os.unlink(runs_log)
    run_env = bench_common.module_runs_env(runs_log)
    run_env.update(env or {})
    lab_before = lab_cpu_snapshot(lab_ids) if lab_ids else None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    machine_before = machine_cpu_seconds()
    result = time_command(argv, label=label, timeout=timeout, log_path=log_path, env=run_env, cwd=cwd)
    machine_after = machine_cpu_seconds()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    lab_after = lab_cpu_snapshot(lab_ids) if lab_ids else None
    # CPU of the command's own process tree: ansible-playbook, its forks and the docker
    # clients they start (the controller's share), not the module runs inside the nodes.
    result["controller_cpu_seconds"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if result.get("hosts"):
        result["controller_cpu_seconds_per_host"] = result["controller_cpu_seconds"] / result["hosts"]
    # CPU of the whole machine while it ran: the controller, dockerd and runc for every
    # `docker exec`, the module runs inside the nodes, and the lab's own services. On a
    # machine where the nodes share the controller's cores this bounds the wall time.
    if machine_before is not None and machine_after is not None:
        result["machine_cpu_seconds"] = machine_after - machine_before
        result["cores"] = usable_cores()
        result["cpu_floor_seconds"] = cpu_floor(result["machine_cpu_seconds"], result["cores"])
    if lab_ids:
        result["lab_cpu"] = lab_cpu_delta(lab_before, lab_after, result["controller_cpu_seconds"])
        result["rerun_cpu_seconds"] = result["lab_cpu"]["rerun_cpu_seconds"]
    result["loadavg_after"] = round(os.getloadavg()[0], 1)
    # Module runs (AnsiballZ starts) per managed host: what a rerun costs a node besides wall time.
    result["module_runs"] = bench_common.count_module_runs(runs_log)
    result["slowest_tasks"] = parse_profile_tasks(result.pop("output", None) or _read(log_path))
    result["log"] = os.path.relpath(log_path, ROOT)
    return result


def _read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return ""


def _lab_running():
    out = _docker(["ps", "--format", "{{.Names}}"], check=False).split()
    missing = [name for name in LAB_CONTAINERS if name not in out]
    return not missing, missing


def section_converge(args, _out_dir, time_command):
    """Run the converge benchmark; returns the report section (never raises for a failed run)."""
    started = time.monotonic()
    sim_dir = os.path.join(ROOT, "build", "bench", "sim")  # persistent (the seed venv), whatever --out is
    logs = os.path.join(sim_dir, "logs")
    os.makedirs(logs, exist_ok=True)
    conv = {"playbooks": list(NODE_PLAYBOOKS), "node_counts": args.converge_nodes, "results": [], "notes": [],
            "mitogen": bool(getattr(args, "mitogen", False))}
    conv.update(_ansible_settings())
    if shutil.which("docker") is None:
        return dict(conv, skipped=True, reason="no docker")
    image = args.converge_image
    if not _docker(["image", "inspect", image, "--format", "{{.Id}}"], check=False).startswith("sha256:"):
        return dict(conv, skipped=True, reason="image %s missing (make image)" % image)

    pip_sources = _pip_sources()
    ca_certificates = sorted(glob.glob("/usr/local/share/ca-certificates/*.crt"))
    secret_file = os.path.join(sim_dir, "api-key")
    if not os.path.exists(secret_file):
        with open(os.open(secret_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as handle:
            handle.write(secrets.token_urlsafe(30))
    variables = node_vars(pip_sources, _read(secret_file).strip(), ca_certificates)
    venv_dir = os.path.join(sim_dir, "engine-venv")
    models_dir = os.path.join(sim_dir, "models")
    tier_dir = os.path.join(sim_dir, "tier")
    uv_cache = os.path.abspath(args.converge_uv_cache)
    for path in (venv_dir, models_dir, uv_cache):
        os.makedirs(path, exist_ok=True)
    common = ["%s:%s:ro" % (m, m) for m in pip_sources.get("mounts", [])] + ["%s:%s" % (uv_cache, UV_CACHE_PATH)]
    conv["uv_cache"] = uv_cache

    if not args.converge_nodes:
        conv["notes"].append("no simulated nodes asked (--converge-nodes none): only the lab rerun")
        conv["lab"] = _lab_rerun(args, logs, time_command)
        conv["targets"] = summarize_targets(conv["results"], conv["lab"])
        conv["seconds"] = time.monotonic() - started
        return conv
    teardown()
    # SIGTERM (a CI timeout, `kill`) becomes SystemExit, so the finally below still removes the nodes.
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        _seed_and_runs(args, conv, image, common, variables, sim_dir, tier_dir, venv_dir, models_dir, logs,
                       time_command)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        conv["error"] = "%s: %s" % (type(exc).__name__, exc)
        log(conv["error"])
    finally:
        log("removing the simulated nodes and network %s" % SIM_NETWORK)
        teardown()
        shutil.rmtree(tier_dir, ignore_errors=True)
        signal.signal(signal.SIGTERM, previous)

    conv["lab"] = _lab_rerun(args, logs, time_command)
    conv["targets"] = summarize_targets(conv["results"], conv["lab"])
    conv["seconds"] = time.monotonic() - started
    return conv


def _exit_on_sigterm(signum, _frame):
    raise SystemExit(128 + signum)


def _seed_and_runs(args, conv, image, common, variables, sim_dir, tier_dir, venv_dir, models_dir, logs,
                   time_command):
    # The seed: a real nodes.yml run that builds (or finds up to date) the shared venv and model.
    log("seed: building or checking the shared engine venv (%s)" % os.path.relpath(venv_dir, ROOT))
    seed = seed_host()
    shutil.rmtree(tier_dir, ignore_errors=True)
    os.makedirs(tier_dir)
    start_containers([seed], image, common + ["%s:%s" % (venv_dir, VENV_PATH), "%s:%s" % (models_dir, MODELS_PATH),
                                              "%s:%s" % (tier_dir, TIER_PATH)])
    seed_inv = os.path.join(sim_dir, "inventory-seed.yml")
    _write_inventory(seed_inv, make_inventory([seed], variables))
    conv["seed"] = _timed(time_command, _playbook_argv(seed_inv, SEED_PLAYBOOKS), "seed",
                          os.path.join(logs, "seed.log"), args.converge_timeout)
    _docker(["rm", "--force", seed["container"]], check=False)
    if conv["seed"]["rc"] != 0:
        raise RuntimeError("the seed run failed (log: %s)" % conv["seed"]["log"])
    node_volumes = common + ["%s:%s:ro" % (venv_dir, VENV_PATH), "%s:%s:ro" % (models_dir, MODELS_PATH),
                             "%s:%s" % (tier_dir, TIER_PATH)]
    for count in args.converge_nodes:
        conv["results"].append(_one_count(args, count, image, node_volumes, variables, sim_dir, tier_dir,
                                          logs, time_command))
        if conv["results"][-1].get("note"):
            conv["notes"].append(conv["results"][-1]["note"])
        # What is done so far survives an interrupted bench (bench.json is written at the end).
        with open(os.path.join(sim_dir, "converge-partial.json"), "w") as handle:
            json.dump(conv, handle, indent=2, sort_keys=True, default=str)


def _one_count(args, count, image, volumes, variables, sim_dir, tier_dir, logs, time_command):
    hosts = sim_hosts(count)
    result = {"nodes": count}
    inventory = os.path.join(sim_dir, "inventory-%d.yml" % count)
    _write_inventory(inventory, make_inventory(hosts, variables))
    try:
        teardown()
        shutil.rmtree(tier_dir, ignore_errors=True)
        os.makedirs(tier_dir)
        # The raised inotify limit is put back after the containers are gone (teardown below).
        with inotify_instances_for(count) as note:
            try:
                if note:
                    log(note)
                    result["note"] = note
                _cold_and_rerun(args, count, hosts, image, volumes, inventory, logs, time_command, result)
            finally:
                teardown()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        result["error"] = "%s: %s" % (type(exc).__name__, exc)
        log("%d nodes: %s" % (count, result["error"]))
    return result


def _cold_and_rerun(args, count, hosts, image, volumes, inventory, logs, time_command, result):
    log("%d nodes: starting containers" % count)
    begin = time.monotonic()
    start_containers(hosts, image, volumes, boot_timeout=120 + 5 * count)
    result["boot_seconds"] = time.monotonic() - begin
    argv = _playbook_argv(inventory, NODE_PLAYBOOKS)
    log("%d nodes: cold run" % count)
    result["cold"] = _timed(time_command, argv, "cold-%d" % count, os.path.join(logs, "cold-%d.log" % count),
                            args.converge_timeout)
    if result["cold"]["rc"] != 0:
        result["error"] = "cold run failed (log: %s)" % result["cold"]["log"]
        return
    log("%d nodes: no-op rerun" % count)
    result["rerun"] = _timed(time_command, argv, "rerun-%d" % count, os.path.join(logs, "rerun-%d.log" % count),
                             args.converge_timeout)
    log("%d nodes: rerun %.1f s, changed=%s" % (count, result["rerun"]["seconds"], result["rerun"]["changed_total"]))


MITOGEN_DIR = os.path.join(ROOT, "build", "mitogen")


def mitogen_strategy_env(mitogen_dir=MITOGEN_DIR, strategy="mitogen_linear"):
    """Environment that runs ansible-playbook under Mitogen's strategy from mitogen_dir (a
    `pip install --target` of the mitogen package, as `make mitogen` makes build/mitogen)."""
    return {"ANSIBLE_STRATEGY_PLUGINS": os.path.join(mitogen_dir, "ansible_mitogen", "plugins", "strategy"),
            "ANSIBLE_STRATEGY": strategy}


def ensure_mitogen(mitogen_dir=MITOGEN_DIR, requirements=os.path.join(ROOT, "requirements-mitogen.txt")):
    """Install the pinned mitogen into mitogen_dir (pip --target, the machine's pip configuration)
    unless it is there; never into the tool venv. Returns mitogen_dir."""
    if not os.path.isdir(os.path.join(mitogen_dir, "ansible_mitogen")):
        log("installing mitogen (%s) into %s" % (os.path.relpath(requirements, ROOT), os.path.relpath(mitogen_dir, ROOT)))
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", mitogen_dir,
                        "-r", requirements], check=True, timeout=600)
    return mitogen_dir


def mitogen_env(args):
    """Environment of the lab rerun: {} unless --mitogen."""
    return mitogen_strategy_env() if getattr(args, "mitogen", False) else {}


def _lab_rerun(args, logs, time_command):
    """The full-stack lab rerun (site.yml, lab inventory) under the lab's lock, when the lab is up."""
    if not args.converge_lab:
        return {"reason": "not asked (--no-converge-lab)"}
    up, missing = _lab_running()
    if not up:
        return {"reason": "lab not up (%s not running)" % ", ".join(missing)}
    log("lab: no-op rerun of site.yml (waits for %s)" % LAB_LOCK)
    argv = _playbook_argv(os.path.join(ROOT, "inventories", "lab", "hosts.yml"), ("playbooks/site.yml",))
    if getattr(args, "mitogen", False):
        ensure_mitogen()
        # Opt-in (docs/mitogen.md): Mitogen's strategy and the lab's docker connection by its short name.
        argv[1:1] = ["-i", os.path.join(ROOT, "inventories", "lab-mitogen.yml")]
    with open(LAB_LOCK, "a") as lock:
        # The lab is shared: hold its lock (the one `flock /tmp/kvcache-lab.lock ...` takes) while
        # the rerun runs; the wait for it is not part of the measured time.
        deadline = time.monotonic() + args.converge_timeout
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() > deadline:
                    return {"reason": "%s held by someone else for %.0f s" % (LAB_LOCK, args.converge_timeout)}
                time.sleep(2)
        try:
            up, missing = _lab_running()
            if not up:
                return {"reason": "lab not up (%s not running)" % ", ".join(missing)}
            rerun = _timed(time_command, argv, "lab-site-rerun", os.path.join(logs, "lab-site-rerun.log"),
                           args.converge_timeout, env=mitogen_env(args), lab_ids=lab_container_ids())
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return {"rerun": rerun}
