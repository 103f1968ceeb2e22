# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gds role up to the hardware boundary: its checks refuse what cannot carry GDS (one
ansible-playbook run, one local host per case), and its cufile.json template renders strict JSON.
The tier's transport is kvcache_mount's setting: its checks, run after gds's as preflight runs
them, refuse GDS on a mount that is not NFS over RDMA."""
import json
import os
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

GPU_OK = {"status": "ok", "driver_branch": "580", "open_kernel_modules_supported": True}
BASE = {"kvcache_tier": "fs", "kvcache_fs_gds": True, "kvcache_lmcache_mode": "inprocess", "gds_rdma_stack": "inbox",
        "nvidia_driver_kernel_modules": "open", "kvcache_mount_proto": "rdma", "kvcache_mount_type": "nfs",
        "kvcache_mount_server": "192.0.2.10", "kvcache_mount_export": "/kvcache", "kvcache_fs_path": "/mnt/kvcache-gds-test",
        "fake_gpu_facts": GPU_OK, "fake_kernel": "6.8.0-45-generic"}
CASES = {
    "ok": {},
    "gds_off": {"kvcache_fs_gds": False, "kvcache_lmcache_mode": "multiprocess", "kvcache_mount_proto": "tcp"},
    "multiprocess": {"kvcache_lmcache_mode": "multiprocess"},
    "tcp_mount": {"kvcache_mount_proto": "tcp"},
    "shared_dir": {"kvcache_mount_type": "shared_dir"},
    "gds_path_outside": {"kvcache_fs_gds_path": "/var/tmp/gds"},
    "bad_addr": {"gds_rdma_dev_addrs": ["10.0.0.5", "mlx5_0"]},
    "ipv6_addr": {"gds_rdma_dev_addrs": ["fd00::5", "192.168.10.30"]},
    "bad_cuda": {"gds_cuda_version": "13.0"},
    "proprietary": {"nvidia_driver_kernel_modules": "proprietary"},
    "pre_turing": {"fake_gpu_facts": dict(GPU_OK, open_kernel_modules_supported=False)},
    "old_branch": {"gds_cuda_version": "13-0", "fake_gpu_facts": dict(GPU_OK, driver_branch="570")},
    "cuda12_on_570": {"gds_cuda_version": "12-8", "fake_gpu_facts": dict(GPU_OK, driver_branch="570")},
    "auto_on_570": {"fake_gpu_facts": dict(GPU_OK, driver_branch="570")},
    "auto_on_470": {"fake_gpu_facts": dict(GPU_OK, driver_branch="470")},
    "no_driver_yet_branch_var": {"gds_cuda_version": "13-0", "fake_gpu_facts": {"status": "no-driver"},
                                 "nvidia_driver_branch": "550"},
    "old_kernel": {"fake_kernel": "4.4.0-210-generic"},
    "mofed_missing": {"gds_rdma_stack": "mofed"},
}
# What each refused case's message must name (the variable or the reason).
REFUSED = {
    "multiprocess": "kvcache_lmcache_mode: inprocess",
    "tcp_mount": "kvcache_mount_proto: rdma",
    "shared_dir": "kvcache_mount_type: nfs",
    "gds_path_outside": "kvcache_fs_gds_path",
    "bad_addr": "mlx5_0",
    "bad_cuda": "gds_cuda_version 13.0",
    "proprietary": "nvidia_driver_kernel_modules is proprietary",
    "pre_turing": "open modules supported: False",
    "old_branch": "branch 580 or newer",
    "auto_on_470": "no CUDA 12 or 13 release for driver branch '470'",
    "no_driver_yet_branch_var": "550",
    "old_kernel": "4.4.0-210-generic",
    "mofed_missing": "ofed_info",
}

PLAYBOOK = """
- hosts: all
  gather_facts: false
  tasks:
    - name: The facts preflight would have gathered
      ansible.builtin.set_fact:
        ansible_facts: "{{ ansible_facts | combine({'gpu_facts': fake_gpu_facts, 'kernel': fake_kernel, 'system': 'Linux'}) }}"
    - name: The role's checks
      ansible.builtin.include_role:
        name: kvcache.offload.gds
        tasks_from: checks
    - name: The tier mount's checks (its transport)
      ansible.builtin.include_role:
        name: kvcache.offload.kvcache_mount
        tasks_from: checks
"""


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gds")
    hosts = {}
    for name, extra in CASES.items():
        host = dict(BASE, ansible_connection="local", ansible_python_interpreter=sys.executable)
        host.update(extra)
        hosts[name] = host
    (tmp / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    (tmp / "play.yml").write_text(PLAYBOOK)
    env = dict(os.environ, ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json", ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
               ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, "build", "collections"), ANSIBLE_FORKS="4",
               ANSIBLE_LOCAL_TEMP=str(tmp / "tmp"), ANSIBLE_HOME=str(tmp / "home"))
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(tmp / "inventory.yml"),
                           str(tmp / "play.yml")], env=env, capture_output=True, text=True, check=False)
    data = json.JSONDecoder().raw_decode(proc.stdout[proc.stdout.index("{"):])[0]
    failures = {}
    for play in data["plays"]:
        for task in play["tasks"]:
            for host, result in task["hosts"].items():
                if result.get("failed"):
                    failures[host] = result.get("msg", "")
    return failures


def test_accepted_cases_pass(outcome):
    for name in ("ok", "gds_off", "ipv6_addr", "cuda12_on_570", "auto_on_570"):
        assert name not in outcome, outcome.get(name)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_with_host_and_fix(outcome, name):
    assert name in outcome, "case %s was not refused" % name
    msg = outcome[name]
    assert msg.startswith("Host %s" % name)
    assert REFUSED[name] in msg
    assert "Fix:" in msg


def render_cufile(**overrides):
    from ansible.template import Templar, trust_as_template
    from ansible.parsing.dataloader import DataLoader
    with open(os.path.join(ROOT, "roles", "gds", "defaults", "main.yml")) as handle:
        variables = yaml.safe_load(handle)
    variables.update({"kvcache_tier": "fs", "kvcache_fs_gds": True})
    variables.update(overrides)
    with open(os.path.join(ROOT, "roles", "gds", "templates", "cufile.json.j2")) as handle:
        source = handle.read()
    variables = {k: trust_as_template(v) if isinstance(v, str) else v for k, v in variables.items()}
    templar = Templar(loader=DataLoader(), variables=variables)
    return json.loads(templar.template(trust_as_template(source)))


def test_cufile_json_compat_off_and_addresses():
    cufile = render_cufile(gds_rdma_dev_addrs=["192.168.10.30"])
    assert cufile["properties"]["allow_compat_mode"] is False
    assert cufile["properties"]["rdma_dev_addr_list"] == ["192.168.10.30"]
    assert cufile["logging"] == {"dir": "/var/log/kvcache/cufile", "level": "ERROR"}
    assert cufile["profile"]["cufile_stats"] == 0


def test_cufile_json_extra_merges():
    cufile = render_cufile(gds_allow_compat_mode=True, gds_cufile_stats=3,
                           gds_cufile_extra={"properties": {"max_direct_io_size_kb": 16384}})
    assert cufile["properties"]["allow_compat_mode"] is True
    assert cufile["properties"]["max_direct_io_size_kb"] == 16384
    assert cufile["properties"]["use_poll_mode"] is False
    assert cufile["profile"]["cufile_stats"] == 3
