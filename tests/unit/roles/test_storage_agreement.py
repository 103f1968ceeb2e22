# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The nodes' side and ONTAP's side of the fs tier agree, from the roles' own defaults
rendered by Ansible's templating: the tier's owner (the fleet-wide service UID/GID) and
the NFS transfer size (NetApp's 64k over RDMA, ONTAP's maximum above the TCP mounts')."""

from __future__ import absolute_import, division, print_function

import os

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

__metaclass__ = type

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def load(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def render(expression, *defaults, **inventory):
    """`expression` with the roles' defaults files (later ones win) and inventory values on top."""
    variables = {}
    for path in defaults:
        variables.update(load(path))
    variables.update(inventory)
    trusted = {k: _trusted(v) for k, v in variables.items()}
    return Templar(loader=DataLoader(), variables=trusted).template(trust_as_template(expression))


def _trusted(value):
    """What Ansible's loader does with a variables file: every string in it may be a template."""
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, list):
        return [_trusted(v) for v in value]
    if isinstance(value, dict):
        return {k: _trusted(v) for k, v in value.items()}
    return value


FLEET = "roles/kvcache/defaults/main.yml"
MOUNT = "roles/kvcache_mount/defaults/main.yml"
ONTAP = "roles/ontap_nfs/defaults/main.yml"


def task(path, name):
    return next(t for t in load(path) if t.get("name") == name)


def test_the_fleet_has_fixed_service_ids():
    fleet = load(FLEET)
    assert fleet["kvcache_service_uid"] == fleet["kvcache_service_gid"] == 2470


def test_nodes_and_ontap_agree_on_the_owner_of_the_tier():
    """Failed on the old roles: ONTAP made the volume root 0:0 while the nodes gave it to the
    service user (a system account with whatever UID the node handed out)."""
    uid, gid = load(FLEET)["kvcache_service_uid"], load(FLEET)["kvcache_service_gid"]
    assert int(render("{{ ontap_nfs_volume_user_id }}", FLEET, ONTAP)) == uid
    assert int(render("{{ ontap_nfs_volume_group_id }}", FLEET, ONTAP)) == gid
    assert int(render("{{ kvcache_mount_owner_uid }}", FLEET, MOUNT)) == uid
    assert int(render("{{ kvcache_mount_group_gid }}", FLEET, MOUNT)) == gid
    # Both roles depend on roles/kvcache, so they read its IDs and restate none.
    for role in ("kvcache_mount", "ontap_nfs"):
        assert "kvcache.offload.kvcache" in [d["role"] for d in load("roles/%s/meta/main.yml" % role)["dependencies"]]
    # An inventory that picks other IDs moves both sides.
    assert render("{{ [ontap_nfs_volume_user_id, kvcache_mount_owner_uid] }}", FLEET, ONTAP, MOUNT,
                  kvcache_service_uid=3100) == [3100, 3100]


@pytest.mark.parametrize("path, user, group", [
    ("roles/inference_env/tasks/main.yml", "Create the service user (fleet-wide UID)",
     "Create the service group (fleet-wide GID)"),
    ("roles/kvcache_mount/tasks/main.yml", "Create the cache owner (fleet-wide UID)",
     "Create the cache owner's group (fleet-wide GID)"),
])
def test_every_role_that_creates_the_service_user_uses_the_fleet_ids(path, user, group):
    user_task, group_task = task(path, user)["ansible.builtin.user"], task(path, group)["ansible.builtin.group"]
    variables = (FLEET, MOUNT)
    assert int(render(user_task["uid"], *variables)) == load(FLEET)["kvcache_service_uid"]
    assert int(render(group_task["gid"], *variables)) == load(FLEET)["kvcache_service_gid"]


@pytest.mark.parametrize("proto, size", [("rdma", 65536), ("tcp", 262144)])
def test_mount_transfer_size(proto, size):
    """NetApp's NFS over RDMA page: NFS mount sizes above 64k are unstable over RDMA.

    Failed on the old role: it mounted with rsize/wsize 262144 over RDMA.
    """
    options = render("{{ kvcache_mount_options }}", FLEET, MOUNT, kvcache_mount_proto=proto).split(",")
    assert "rsize=%d" % size in options and "wsize=%d" % size in options
    assert options[:5] == ["vers=4.1", "proto=" + proto, "sec=sys", "trunkdiscovery", "write=eager"]


@pytest.mark.parametrize("security", ["sys", "krb5", "krb5i", "krb5p"])
def test_the_export_rule_and_the_mount_share_one_security_flavour(security):
    """Issue #33 (Kerberos): kvcache_nfs_security is one fleet value for ONTAP's export rule and
    the nodes' sec= mount option. Failed before it: the rule said sys, the mount said nothing."""
    rule = render("{{ [ontap_nfs_rule_ro, ontap_nfs_rule_rw] }}", FLEET, ONTAP, kvcache_nfs_security=security)
    options = render("{{ kvcache_mount_options }}", FLEET, MOUNT, kvcache_nfs_security=security).split(",")
    assert rule == [[security], [security]]
    assert "sec=" + security in options


def test_ontap_lets_the_default_mounts_through():
    """ONTAP's own default maximum (65536) would cut the TCP mounts' 262144 down silently."""
    largest = max(int(render("{{ kvcache_mount_rsize }}", FLEET, MOUNT, kvcache_mount_proto=p)) for p in ("rdma", "tcp"))
    assert load(ONTAP)["ontap_nfs_max_transfer_size"] >= largest


def test_the_tier_is_mounted_data_only():
    """Issue #33: nosuid,nodev,noexec on the NFS mount by default; an empty list leaves them out.

    Failed on the role before it: the mount had none of them.
    """
    for proto in ("rdma", "tcp"):
        options = render("{{ kvcache_mount_options }}", FLEET, MOUNT, kvcache_mount_proto=proto).split(",")
        assert options[-3:] == ["nosuid", "nodev", "noexec"]
    options = render("{{ kvcache_mount_options }}", FLEET, MOUNT, kvcache_mount_security_options=[]).split(",")
    assert not {"nosuid", "nodev", "noexec"} & set(options)


def test_the_export_squashes_root_and_leaves_the_root_volume_alone():
    """Issue #33: superuser none (the volume root is the service user's already), no root-volume rule,
    no subnet, by default. Failed on the role before it: superuser sys, a rule in the root volume's
    policy, and no ontap_nfs_client_cidrs."""
    ontap = load(ONTAP)
    assert ontap["ontap_nfs_rule_superuser"] == ["none"]
    assert ontap["ontap_nfs_open_root_volume_policy"] is False
    assert ontap["ontap_nfs_client_cidrs"] == []


def test_root_on_the_nodes_needs_nothing_from_the_tier():
    """With root squashed, the nodes' tasks on the mounted tier must not need root there: kvcache_mount
    changes the mode as the owner (runuser), and chowns (as root) only when the owner is wrong."""
    tasks = load("roles/kvcache_mount/tasks/nfs.yml")
    chmod = next(t for t in tasks if t["name"].startswith("Set the cache directory's mode"))
    assert chmod["ansible.builtin.command"]["argv"][:4] == ["runuser", "-u", "{{ kvcache_mount_owner }}", "--"]
    chown = next(t for t in tasks if t["name"].startswith("Give the cache directory to the service user"))
    assert any("stat.uid !=" in condition for condition in chown["when"])


@pytest.mark.parametrize("security, proto, packages", [
    ("sys", "rdma", ["nfs-common", "rdma-core"]),
    ("krb5p", "tcp", ["nfs-common", "krb5-user", "gssproxy"]),
])
def test_the_nfs_path_installs_the_kerberos_client_with_the_nfs_client(security, proto, packages):
    """One package run on the node (tasks/nfs.yml) brings what the Kerberos tasks need."""
    got = render("{{ __kvcache_mount_client_packages }}", FLEET, MOUNT, "roles/kvcache_mount/vars/main.yml",
                 "roles/kvcache_mount/vars/Debian.yml", kvcache_nfs_security=security, kvcache_mount_proto=proto)
    assert got == packages
