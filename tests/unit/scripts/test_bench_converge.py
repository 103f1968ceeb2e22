"""Unit tests for the pure helpers of scripts/bench_converge.py (no docker, no ansible runs)."""
import importlib.util
import os

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SPEC = importlib.util.spec_from_file_location("kvcache_offload_bench_converge",
                                              os.path.join(ROOT, "scripts", "bench_converge.py"))
conv = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(conv)

PIP = {"find_links": ["/srv/wheels"], "extra_index_urls": ["file:///srv/simple"], "mounts": ["/srv/wheels"]}


def test_parse_nodes():
    assert conv.parse_nodes("32,2,8,8") == [2, 8, 32]
    assert conv.parse_nodes("2") == [2]
    assert conv.parse_nodes("none") == []  # only the lab rerun
    for bad in ("", "0,2", "2,%d" % (conv.MAX_NODES + 1)):
        with pytest.raises(ValueError):
            conv.parse_nodes(bad)


def test_sim_hosts_never_use_lab_names_or_network():
    hosts = conv.sim_hosts(32)
    assert len(hosts) == 32
    assert hosts[0] == {"name": "sim-node01", "container": "kvcache-sim-node01", "address": "172.29.110.11"}
    assert hosts[-1]["address"] == "172.29.110.42"
    assert len({h["address"] for h in hosts}) == 32
    assert all(h["container"].startswith("kvcache-sim-") and "lab" not in h["container"] for h in hosts)
    assert conv.seed_host()["address"] not in {h["address"] for h in hosts}
    with pytest.raises(ValueError):
        conv.sim_hosts(0)


def test_inventory_engines_installed_not_started():
    hosts = conv.sim_hosts(2)
    variables = conv.node_vars(PIP, "k" * 40, ["/usr/local/share/ca-certificates/site.crt"])
    inv = conv.make_inventory(hosts, variables)
    # YAML round trip: what the file holds.
    inv = yaml.safe_load(yaml.safe_dump(inv))
    nodes = inv["all"]["children"]["kvcache_nodes"]["hosts"]
    assert nodes["sim-node02"] == {"ansible_host": "172.29.110.12", "ansible_docker_host": "kvcache-sim-node02"}
    v = inv["all"]["vars"]
    assert v["vllm_start_instances"] is False
    assert v["ansible_connection"] == "community.docker.docker"
    assert v["kvcache_mount_type"] == "shared_dir" and v["kvcache_tier"] == "fs"
    assert v["inference_env_profile"] == "cpu"
    assert v["inference_env_find_links"] == ["/srv/wheels"]
    assert v["inference_env_extra_index_urls"] == ["file:///srv/simple"]
    assert [i["name"] for i in v["vllm_instances"]] == ["cpu0"]
    for group in ("kvcache_router", "kvcache_storage_controllers", "kvcache_s3_store"):
        assert inv["all"]["children"][group]["hosts"] == {}


def test_docker_run_argv_uses_own_network_and_label():
    host = conv.sim_hosts(1)[0]
    argv = conv.docker_run_argv(host, "img:1", ["/a:/a:ro"])
    assert argv[0] == "run"
    assert argv[argv.index("--network") + 1] == "kvcache-sim"
    assert argv[argv.index("--ip") + 1] == "172.29.110.11"
    assert argv[argv.index("--label") + 1] == conv.SIM_LABEL
    assert "/a:/a:ro" in argv and argv[-2:] == ["img:1", "/lib/systemd/systemd"]
    # The firewall role loads nftables in the node's namespace, as on the lab's containers.
    assert argv[argv.index("--cap-add") + 1] == "NET_ADMIN"


PROFILE = """
PLAY RECAP *********************************************************************
sim-node01                 : ok=10   changed=0    unreachable=0    failed=0    skipped=3    rescued=0    ignored=0

Sunday 01 March 2026  01:00:00 +0000 (0:00:00.100)       0:00:12.000 *******
===============================================================================
kvcache.offload.inference_env : Refresh the apt cache ------------------- 1.50s
kvcache.offload.preflight : Gather the facts preflight needs ------------ 3.25s
Restart marked instances in batches ------------------------------------- 0.20s
"""


def test_parse_profile_tasks():
    rows = conv.parse_profile_tasks(PROFILE, top=2)
    assert rows == [{"task": "kvcache.offload.preflight : Gather the facts preflight needs", "seconds": 3.25},
                    {"task": "kvcache.offload.inference_env : Refresh the apt cache", "seconds": 1.5}]
    assert conv.parse_profile_tasks("no summary here") == []


def _res(nodes, seconds, changed=0, rc=0):
    return {"nodes": nodes, "rerun": {"seconds": seconds, "changed_total": changed, "rc": rc}}


def test_targets_met():
    t = conv.summarize_targets([_res(2, 10.0), _res(8, 15.0), _res(32, 30.0)],
                               {"rerun": {"seconds": 45.0, "rc": 0, "changed_total": 0}})
    assert t["changed_zero"] is True
    assert t["ratio"] == pytest.approx(3.0) and t["ratio_nodes"] == [2, 32] and t["ratio_met"] is True
    assert t["lab_seconds"] == 45.0 and t["lab_met"] is True and t["lab_changed_zero"] is True


def test_targets_not_met_and_not_measured():
    t = conv.summarize_targets([_res(2, 10.0), _res(32, 41.0, changed=3)], {"reason": "lab not up"})
    assert t["changed_zero"] is False
    assert t["ratio"] == pytest.approx(4.1) and t["ratio_met"] is False
    assert t["lab_met"] is None and t["lab_seconds"] is None
    # one count only, or a failed run: no ratio, never "met"
    t = conv.summarize_targets([_res(2, 10.0), _res(32, 20.0, rc=2)])
    assert t["ratio"] is None and t["ratio_met"] is None and t["changed_zero"] is False
    assert conv.summarize_targets([])["changed_zero"] is None


def test_render_markdown():
    section = {"playbooks": ["playbooks/nodes.yml"], "forks": 20, "pipelining": True,
               "results": [dict(_res(2, 10.0), cold={"seconds": 100.0, "rc": 0}),
                           dict(_res(8, 12.0), cold={"seconds": 150.0, "rc": 0})],
               "lab": {"reason": "lab not up"}}
    section["results"][1]["rerun"]["per_host_seconds"] = 1.5
    section["results"][1]["rerun"]["slowest_tasks"] = [{"task": "x : y", "seconds": 2.0}]
    section["results"][1]["rerun"]["module_runs"] = {"total": 300, "per_node": 37.5, "controller": 0,
                                                     "by_module": [["ansible.builtin.stat", 120]],
                                                     "by_task": [["vllm : Write the unit", 16]]}
    section["targets"] = conv.summarize_targets(section["results"], section["lab"])
    text = "\n".join(conv.render_markdown(section))
    assert "| 8 | 150.0 | 12.0 | 1.50 | - | - | - | 37.5 | 0 |" in text
    assert "| 2 | 100.0 | 10.0 | - | - | - | - | - | 0 |" in text
    assert "- 16 vllm : Write the unit" in text
    assert "rerun(8 nodes) / rerun(2 nodes) < 4x: **met** (1.20x)" in text
    assert "lab rerun < 60 s: **not measured**" in text
    assert "- 2.00 s x : y" in text
    assert conv.render_markdown({"skipped": True, "reason": "no docker"})[-2] == "Skipped: no docker."


def test_inotify_instances_needed_grows_with_the_node_count():
    assert conv.inotify_instances_needed(0) == conv.INOTIFY_RESERVE
    assert conv.inotify_instances_needed(32) == 32 * conv.INOTIFY_PER_CONTAINER + conv.INOTIFY_RESERVE
    # Debian's default (128) is too low for 32 nodes (it stopped node 23 from booting), enough for 2.
    assert conv.inotify_instances_needed(32) > 128
    assert conv.inotify_instances_needed(2) <= 128


def test_ensure_inotify_instances_raises_a_low_limit_and_leaves_a_high_one(tmp_path):
    sysctl = tmp_path / "max_user_instances"
    sysctl.write_text("128\n")
    note = conv.ensure_inotify_instances(32, path=str(sysctl))
    assert int(sysctl.read_text()) == conv.inotify_instances_needed(32)
    assert "from 128 to %d" % conv.inotify_instances_needed(32) in note
    sysctl.write_text("100000\n")
    assert conv.ensure_inotify_instances(32, path=str(sysctl)) is None
    assert sysctl.read_text() == "100000\n"


def test_ensure_inotify_instances_names_the_fix_when_it_cannot_raise(tmp_path, monkeypatch):
    sysctl = tmp_path / "max_user_instances"
    sysctl.write_text("128\n")
    real_open = open

    def read_only(path, mode="r", **kwargs):
        if "w" in mode:
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, mode, **kwargs)

    monkeypatch.setattr(conv, "open", read_only, raising=False)
    with pytest.raises(RuntimeError) as err:
        conv.ensure_inotify_instances(32, path=str(sysctl))
    assert "sysctl -w fs.inotify.max_user_instances=%d" % conv.inotify_instances_needed(32) in str(err.value)
    assert sysctl.read_text() == "128\n"


STAT = """cpu  1000 50 400 9000 30 20 10 70 5 0
cpu0 500 25 200 4500 15 10 5 35 0 0
intr 12345
"""


def test_cpu_busy_seconds_counts_work_not_idle_iowait_or_steal():
    # user 1000 + nice 50 + system 400 + irq 20 + softirq 10 ticks, at 100 ticks per second
    assert conv.cpu_busy_seconds(STAT, 100) == pytest.approx(14.8)
    with pytest.raises(ValueError):
        conv.cpu_busy_seconds("intr 1\n", 100)


def test_machine_cpu_seconds_reads_proc_stat_or_says_none(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(STAT)
    assert conv.machine_cpu_seconds(str(stat)) == pytest.approx(1480.0 / os.sysconf("SC_CLK_TCK"))
    assert conv.machine_cpu_seconds(str(tmp_path / "missing")) is None
    assert conv.cpu_floor(None, 2) is None and conv.cpu_floor(100.0, 0) is None
    assert conv.cpu_floor(188.0, 2) == pytest.approx(94.0)


def test_lab_target_out_of_reach_when_the_cpu_floor_is_above_it():
    lab = {"rerun": {"seconds": 104.0, "rc": 0, "changed_total": 0, "hosts": 5,
                     "machine_cpu_seconds": 150.0, "cores": 2, "cpu_floor_seconds": 75.0}}
    t = conv.summarize_targets([], lab)
    assert t["lab_met"] is False and t["lab_cpu_floor_seconds"] == 75.0 and t["lab_reachable_here"] is False
    text = "\n".join(conv.render_markdown({"results": [], "lab": lab, "targets": t}))
    assert "busy for 150.0 CPU-seconds" in text and "at least 75.0 s here" in text
    assert "CPU floor on this machine (75.0 s) is above the 60 s target" in text
    # a floor under the target says nothing of the kind, met or not
    lab["rerun"]["cpu_floor_seconds"] = 40.0
    t = conv.summarize_targets([], lab)
    assert t["lab_reachable_here"] is True and t["lab_met"] is False
    assert "CPU floor on this machine" not in "\n".join(conv.render_markdown({"results": [], "lab": lab, "targets": t}))


def test_inotify_instances_for_puts_a_raised_limit_back(tmp_path):
    sysctl = tmp_path / "max_user_instances"
    sysctl.write_text("128\n")
    with conv.inotify_instances_for(32, path=str(sysctl)) as note:
        assert "from 128" in note
        assert int(sysctl.read_text()) == conv.inotify_instances_needed(32)
    assert sysctl.read_text() == "128\n"
    # also when the block fails
    with pytest.raises(RuntimeError):
        with conv.inotify_instances_for(32, path=str(sysctl)):
            raise RuntimeError("boom")
    assert sysctl.read_text() == "128\n"
    # a limit high enough is neither raised nor written
    sysctl.write_text("100000\n")
    with conv.inotify_instances_for(32, path=str(sysctl)) as note:
        assert note is None
    assert sysctl.read_text() == "100000\n"


# The lab rerun's own CPU (issue #24): cgroups, shims and the process tree, not /proc/stat.

def _pid_stat(pid, comm, utime, stime, cutime, cstime):
    # /proc/<pid>/stat: pid (comm) state ppid ... utime(14) stime(15) cutime(16) cstime(17) ...
    return "%d (%s) S 1 %d 0 0 -1 0 0 0 0 0 %d %d %d %d 20 0 1 0\n" % (pid, comm, pid, utime, stime, cutime, cstime)


def test_proc_stat_cpu_seconds_counts_reaped_children():
    text = _pid_stat(7, "containerd-shim", 100, 50, 30, 20)  # comm may hold spaces and parentheses too
    assert conv.proc_stat_cpu_seconds(text, 100) == pytest.approx(2.0)
    assert conv.proc_stat_cpu_seconds(text, 100, children=False) == pytest.approx(1.5)
    assert conv.proc_stat_cpu_seconds(_pid_stat(8, "a (b) c", 10, 0, 0, 0), 10) == pytest.approx(1.0)


def _fake_proc(root, processes):
    for pid, comm, cmdline, ticks in processes:
        base = root / str(pid)
        base.mkdir()
        (base / "stat").write_text(_pid_stat(pid, comm, *ticks))
        (base / "cmdline").write_text("\0".join(cmdline.split()) + "\0")


def test_lab_cpu_snapshot_and_delta(tmp_path, monkeypatch):
    cgroups = tmp_path / "cpuacct"
    for cid, ns in (("id1", 5 * 10 ** 9), ("id2", 3 * 10 ** 9), ("other", 9 * 10 ** 9)):
        (cgroups / cid).mkdir(parents=True)
        (cgroups / cid / "cpuacct.usage").write_text("%d\n" % ns)
    monkeypatch.setattr(conv, "CGROUP_CPUACCT", str(cgroups))
    proc = tmp_path / "proc"
    proc.mkdir()
    _fake_proc(proc, [
        (10, "containerd-shim", "/usr/bin/containerd-shim-runc-v2 -namespace moby -id id1 -address x", (100, 0, 0, 0)),
        (11, "containerd-shim", "/usr/bin/containerd-shim-runc-v2 -namespace moby -id id2 -address x", (0, 0, 0, 0)),
        (12, "containerd-shim", "/usr/bin/containerd-shim-runc-v2 -namespace moby -id other -address x", (500, 0, 0, 0)),
        (13, "dockerd", "dockerd", (1000, 0, 0, 0)),
        (14, "containerd", "containerd --config c", (1000, 0, 0, 0)),
        (15, "python3", "python3 something", (9999, 0, 0, 0)),
    ])
    ids = {"kvcache-lab-node1": "id1", "kvcache-lab-node2": "id2"}
    before = conv.lab_cpu_snapshot(ids, proc=str(proc), ticks=100)
    assert before["containers"] == {"kvcache-lab-node1": 5.0, "kvcache-lab-node2": 3.0}
    assert before["shims"] == {"kvcache-lab-node1": 1.0, "kvcache-lab-node2": 0.0}  # not the other container's
    assert before["daemons"] == {"dockerd": 10.0, "containerd": 10.0}
    # 12 s in node1's cgroup, 1 s in node2's; node1's shim reaped runc processes worth 2 s
    (cgroups / "id1" / "cpuacct.usage").write_text("%d\n" % (17 * 10 ** 9))
    (cgroups / "id2" / "cpuacct.usage").write_text("%d\n" % (4 * 10 ** 9))
    (cgroups / "other" / "cpuacct.usage").write_text("%d\n" % (99 * 10 ** 9))
    (proc / "10" / "stat").write_text(_pid_stat(10, "containerd-shim", 100, 0, 150, 50))
    (proc / "13" / "stat").write_text(_pid_stat(13, "dockerd", 1500, 0, 0, 0))
    after = conv.lab_cpu_snapshot(ids, proc=str(proc), ticks=100)
    got = conv.lab_cpu_delta(before, after, controller_cpu=20.0)
    assert got["containers"] == {"kvcache-lab-node1": pytest.approx(12.0), "kvcache-lab-node2": pytest.approx(1.0)}
    assert got["containers_total"] == pytest.approx(13.0)
    assert got["shims"] == pytest.approx(2.0)
    # the rerun's CPU: what the shims reaped (the exec'd module runs) 2 + the controller's process
    # tree 20; the cgroups (services and the same module runs), the other container, the other
    # process and the shared docker daemons (5 s) are not in it
    assert got["rerun_cpu_seconds"] == pytest.approx(22.0)
    assert got["daemons"] == pytest.approx(5.0) and got["complete"] is True
    lab = {"rerun": {"seconds": 60.0, "rc": 0, "changed_total": 0, "hosts": 5, "lab_cpu": got}}
    text = "\n".join(conv.render_markdown({"results": [], "lab": lab, "targets": {}, "mitogen": True}))
    assert "own CPU (what it started, whatever else runs on the machine): 22.0 CPU-seconds" in text
    assert "2.0 in what the lab containers' shims reaped (the docker exec'd module runs), under Mitogen" in text
    # a container whose cgroup vanished makes the sum incomplete, and says so
    (cgroups / "id2" / "cpuacct.usage").unlink()
    assert conv.lab_cpu_delta(before, conv.lab_cpu_snapshot(ids, proc=str(proc), ticks=100), 20.0)["complete"] is False


def test_mitogen_env_only_when_asked():
    class Args:
        mitogen = False
    assert conv.mitogen_env(Args()) == {}
    Args.mitogen = True
    env = conv.mitogen_env(Args())
    assert env["ANSIBLE_STRATEGY"] == "mitogen_linear"
    assert env["ANSIBLE_STRATEGY_PLUGINS"].endswith(os.path.join("build", "mitogen", "ansible_mitogen", "plugins",
                                                                 "strategy"))
