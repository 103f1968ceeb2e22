"""ontap_nfs against the ONTAP REST test double at several ONTAP releases: exact calls and
payloads, idempotence (also after the nodes have written the volume's owner), the release
gates (NFSv4.1 over RDMA, trunking), RDMA kept node-local, the SVM root volume's export
policy, the storage-network clients, TLS with a site CA, secrets kept out of the output,
and bad input refused before any change."""
import os

import pytest
import yaml

from tests.doubles.ontap_rest import OntapDouble
from tests.integration.conftest import ROOT, flat, fleet_default, recap

PASSWORD = "double-password-123"
RELEASES = [(9, 12, 1), (9, 14, 1), (9, 19, 1)]
# What a release below 9.14.1 cannot do (the role refuses it), so tests there leave it out.
# Without an RDMA LIF the nodes mount over TCP (the role refuses RDMA mounts without one).
TCP = {"ontap_nfs_rdma_lifs": [], "kvcache_mount_proto": "tcp"}
OLD_RELEASE = dict(TCP, ontap_nfs_trunking=False)


def start(tls_dir, version=(9, 14, 1), root_rule=True, **kwargs):
    """The double, by default with the read-only rule an NFS SVM's root volume policy has."""
    double = OntapDouble(tls_dir, version=version, **kwargs).start()
    if root_rule:
        let_clients_through_the_root_volume(double)
    return double


@pytest.fixture
def ontap(tls_dir):
    double = start(tls_dir)
    yield double
    double.stop()


# The GPU nodes of storage_playbooks/ontap_nfs/inventory.yml, as the export rule must name them:
# each by its own storage-network address, a host match (issue #33).
NODES = [{"match": "10.30.0.21/32"}, {"match": "10.30.0.22/32"}]
# The tier's rule: NFSv4, sys auth, root squashed (issue #33: superuser none by default).
TIER_RULE = {"protocols": ["nfs4"], "superuser": ["none"], "ro_rule": ["sys"], "rw_rule": ["sys"]}
# The only rule the role may add to the SVM root volume's policy, and only when asked.
ROOT_RULE = {"protocols": ["nfs4"], "superuser": ["none"], "ro_rule": ["sys"], "rw_rule": ["never"]}


def let_clients_through_the_root_volume(ontap):
    """What the storage team has done on an SVM that serves NFS: a read-only rule in the root
    volume's policy (ONTAP's `default`). The role checks it is there and adds none by default."""
    ontap._create_rules({"clients": [{"match": "10.30.0.0/24"}], "protocols": ["nfs4"], "ro_rule": ["sys"],
                         "rw_rule": ["never"], "superuser": ["none"]}, ontap.policy("default"))


def rule_posts(ontap, policy):
    return [r for r in mutating(ontap) if r.call == "POST /api/protocols/nfs/export-policies/%d/rules"
            % ontap.policy(policy)["id"]]


def role_vars(ontap, **extra):
    data = {
        "ontap_nfs_hostname": "127.0.0.1",
        "ontap_nfs_http_port": ontap.server.port,
        "ontap_nfs_validate_certs": False,  # the test double's throw-away certificate (see test_tls_*)
        "ontap_nfs_username": "admin",
        "ontap_nfs_password": PASSWORD,
        "ontap_nfs_svm": "svm_kv",
        "ontap_nfs_aggregate": "aggr1",
        "ontap_nfs_volume_size_gb": 200,
        "ontap_nfs_rdma_lifs": ["kv_data1"],
    }
    data.update(extra)
    return data


def mutating(ontap):
    return [r for r in ontap.server.requests if r["method"] not in ("GET", "HEAD")]


def calls_of(ontap):
    return [r.call for r in mutating(ontap)]


def first_run_calls(ontap, version, root_volume_rule=False):
    service = "/api/protocols/nfs/services"
    rules = "/api/protocols/nfs/export-policies/%d/rules"
    kvcache, default = ontap.policy("kvcache")["id"], ontap.policy("default")["id"]
    calls = ["POST " + service]
    if version >= (9, 14, 1):
        calls.append("PATCH %s/%s" % (service, ontap.svm["uuid"]))
    calls += ["POST /api/protocols/nfs/export-policies", "POST " + rules % kvcache, "PATCH %s/1" % (rules % kvcache)]
    calls += ["POST " + rules % default] if root_volume_rule else []
    calls += ["POST /api/storage/volumes"]
    if version >= (9, 14, 1):
        calls.append("PATCH /api/network/ip/interfaces/" + ontap.lif("kv_data1")["uuid"])
    return calls


@pytest.mark.parametrize("version", RELEASES, ids=lambda v: ".".join(map(str, v)))
def test_first_run_and_rerun(tls_dir, run_playbook, version):
    """Exact changes and payloads at each release; after the nodes have made the tier their
    service user's, a rerun changes nothing.

    Failed on the old role: the volume was made root:root (nas.uid/gid 0) and PATCHed back to
    0:0 on the rerun after the nodes' chown, the root volume's policy got no rule, the SVM no
    trunking and no transfer size, the export rule named the nodes' management addresses
    (10.20.0.x), and 9.12.1 got RDMA on its LIF.

    Issue #33, failed on the role before it: the tier's rule let root through (superuser sys),
    named the nodes by bare address, and a rule was added to the root volume's policy by default.
    """
    ontap = start(tls_dir, version)
    try:
        extra = OLD_RELEASE if version < (9, 14, 1) else {}
        result = run_playbook("ontap_nfs", role_vars(ontap, **extra))
        assert result.returncode == 0, result.stdout[-4000:]
        assert calls_of(ontap) == first_run_calls(ontap, version)
        changes = mutating(ontap)
        assert changes[0]["body"] == {"svm.name": "svm_kv", "protocol.v41_enabled": "true",
                                      "protocol.v41_features.pnfs_enabled": "true", "enabled": "true",
                                      "transport.tcp_max_transfer_size": 262144}
        if version >= (9, 14, 1):
            assert changes[1]["body"] == {"protocol.v41_features.trunking_enabled": True,
                                          "transport.rdma_enabled": True}
            assert changes[-1]["body"] == {"rdma_protocols": ["roce"]}
        by_call = {r.call: r for r in changes}
        kvcache, default = ontap.policy("kvcache")["id"], ontap.policy("default")["id"]
        # One rule for both GPU nodes, each by its storage-network address (not ansible_host) as a
        # host match, root squashed.
        assert by_call["POST /api/protocols/nfs/export-policies/%d/rules" % kvcache]["body"] == dict(TIER_RULE, clients=NODES)
        # The SVM root volume's policy is left alone (it already lets the nodes through).
        assert "POST /api/protocols/nfs/export-policies/%d/rules" % default not in by_call
        assert len(ontap.rules[default]) == 1
        assert by_call["POST /api/storage/volumes"]["body"] == {
            "name": "kvcache", "svm.name": "svm_kv", "aggregates": [{"name": "aggr1"}],
            "size": 200 * 1024 ** 3, "snapshot_policy.name": "none", "nas.unix_permissions": "770",
            "nas.gid": 2470, "nas.uid": 2470, "nas.security_style": "unix", "nas.export_policy.name": "kvcache",
            "nas.path": "/kvcache", "state": "online",
        }
        assert recap(result.stdout)["changed"] == len(first_run_calls(ontap, version)) - 1  # the re-index is one task
        # Every call authenticated as the configured user, over HTTPS; the password never printed.
        assert ontap.server.scheme == "https"
        assert all(r["user"] == ["admin", PASSWORD] for r in ontap.server.requests)
        assert PASSWORD not in result.stdout + result.stderr

        # The nodes stage chowns the mounted root to kvcache_service_user:group (kvcache_mount):
        # through NFS, ONTAP stores their numbers, the fleet-wide IDs.
        ontap.volume("kvcache")["nas"].update(uid=fleet_default("kvcache_service_uid"),
                                              gid=fleet_default("kvcache_service_gid"), unix_permissions=770)
        ontap.server.clear()
        result = run_playbook("ontap_nfs", role_vars(ontap, **extra))
        assert result.returncode == 0, result.stdout[-4000:]
        assert mutating(ontap) == []
        assert recap(result.stdout)["changed"] == 0
    finally:
        ontap.stop()


@pytest.mark.parametrize("settings, expected", [
    # ONTAP's default 65536 is raised to what TCP mounts use.
    ({"tcp_max_transfer_size": 65536}, {"protocol.v41_enabled": "true", "protocol.v41_features.pnfs_enabled": "true",
                                        "transport.tcp_max_transfer_size": 262144}),
    # A larger size is never lowered (clients mounted with it would hang).
    ({"tcp_max_transfer_size": 1048576}, {"protocol.v41_enabled": "true", "protocol.v41_features.pnfs_enabled": "true"}),
], ids=["raised", "never-lowered"])
def test_existing_nfs_service_is_patched_not_recreated(ontap, run_playbook, settings, expected):
    """Failed on the old role: the transfer size was never set (ONTAP's 65536 cut 262144 mounts down)."""
    ontap.nfs_services.append({
        "svm": dict(ontap.svm), "enabled": True, "state": "online",
        "protocol": {"v3_enabled": True, "v40_enabled": False, "v41_enabled": False,
                     "v41_features": {"pnfs_enabled": False, "trunking_enabled": False}},
        "transport": dict(settings, tcp_enabled=True, udp_enabled=True, rdma_enabled=False),
    })
    result = run_playbook("ontap_nfs", role_vars(ontap, **TCP))
    assert result.returncode == 0, result.stdout[-4000:]
    first, second = mutating(ontap)[:2]
    assert first.call == "PATCH /api/protocols/nfs/services/" + ontap.svm["uuid"]
    assert first["body"] == expected
    assert second["body"] == {"protocol.v41_features.trunking_enabled": True}
    assert ontap.nfs_service()["transport"]["tcp_max_transfer_size"] == max(262144, settings["tcp_max_transfer_size"])
    assert "PATCH /api/network/ip/interfaces" not in " ".join(ontap.server.calls())


@pytest.mark.parametrize("extra, says", [
    ({"ontap_nfs_trunking": False}, "NFSv4.1 over RDMA needs ONTAP 9.14.1"),
    (TCP, "NFS trunking needs 9.14.1"),
], ids=["rdma", "trunking"])
def test_release_gates_refuse_before_any_change(tls_dir, run_playbook, extra, says):
    """At 9.12.1: NFSv4.1 over RDMA and trunking need 9.14.1 (NetApp's NFS over RDMA and trunking pages).

    Failed on the old role: it enabled RDMA on the LIF of a 9.12.1 cluster (it said 9.10.1) and had no trunking.
    """
    ontap = start(tls_dir, (9, 12, 1))
    try:
        result = run_playbook("ontap_nfs", role_vars(ontap, **extra))
        assert result.returncode != 0
        assert says in flat(result.stdout) and "Fix:" in flat(result.stdout)
        assert mutating(ontap) == []
    finally:
        ontap.stop()


@pytest.mark.parametrize("extra, says", [
    ({"ontap_nfs_flexgroup": True, "ontap_nfs_aggregate": "", "ontap_nfs_flexgroup_aggregates": ["aggr1", "aggr2"]},
     "would spread over the aggregates of nodes node1, node2"),
    ({"ontap_nfs_rdma_lifs": ["kv_data1", "kv_data2"]}, "LIF kv_data2 is homed on another node"),
], ids=["flexgroup-over-two-nodes", "lif-on-another-node"])
def test_rdma_stays_node_local(ontap, run_playbook, extra, says):
    """NetApp: NFS over RDMA is node-local; FlexGroups only with all constituents on one node.

    Failed on the old role: it made the two-node FlexGroup and enabled RDMA on both LIFs without a word.
    """
    result = run_playbook("ontap_nfs", role_vars(ontap, **extra))
    assert result.returncode != 0
    assert says in flat(result.stdout) and "Fix:" in flat(result.stdout)
    assert mutating(ontap) == []


def test_flexgroup_spreads_over_the_aggregates(ontap, run_playbook):
    result = run_playbook("ontap_nfs", role_vars(
        ontap, ontap_nfs_flexgroup=True, ontap_nfs_aggregate="", ontap_nfs_flexgroup_aggregates=["aggr1", "aggr2"], **TCP))
    assert result.returncode == 0, result.stdout[-4000:]
    volume = [r for r in mutating(ontap) if r.call == "POST /api/storage/volumes"][0]
    assert volume["body"]["aggregates"] == [{"name": "aggr1"}, {"name": "aggr2"}]
    assert volume["body"]["constituents_per_aggregate"] == 4
    assert [r["body"]["clients"] for r in rule_posts(ontap, "kvcache")] == [NODES]


def test_nodes_without_a_storage_address_are_refused(ontap, run_playbook):
    """Their ansible_host is a management address: ONTAP would refuse the nodes on the RoCE network.

    Failed on the old role: it exported to ansible_host (10.20.0.x) without a word.
    """
    result = run_playbook("ontap_nfs", role_vars(ontap), inventory="inventory-management-only.yml")
    assert result.returncode != 0
    out = flat(result.stdout)
    assert "gpu-a, gpu-b have no ontap_nfs_client_address" in out and "Fix:" in out
    assert ontap.server.requests == []


def test_root_volume_policy_is_only_checked_by_default(tls_dir, run_playbook):
    """By default (ontap_nfs_open_root_volume_policy false) the role adds no rule to the root volume's
    policy: an empty one refuses every client, so the role fails, before any change, naming the rule
    to add (the nodes' host matches) and the variable.

    Issue #33, failed on the role before it: it added a rule to `default` (true by default) and went on.
    """
    ontap = start(tls_dir, root_rule=False)
    try:
        result = run_playbook("ontap_nfs", role_vars(ontap))
        out = flat(result.stdout)
        assert result.returncode != 0, out[-3000:]
        assert "root volume has no rule" in out and "Fix:" in out
        assert "-clientmatch 10.30.0.21/32,10.30.0.22/32" in out and "ontap_nfs_open_root_volume_policy: true" in out
        assert mutating(ontap) == []
        assert ontap.rules[ontap.policy("default")["id"]] == []
    finally:
        ontap.stop()


def test_root_volume_rule_when_asked_is_read_only_for_the_same_nodes(tls_dir, run_playbook):
    """ontap_nfs_open_root_volume_policy true: one rule in the root volume's policy, read-only, root
    squashed, for exactly the nodes' host matches (no subnet); a rerun changes nothing.

    Issue #33, failed on the role before it: the rule named the nodes by bare address.
    """
    ontap = start(tls_dir, root_rule=False)
    try:
        asked = role_vars(ontap, ontap_nfs_open_root_volume_policy=True)
        result = run_playbook("ontap_nfs", asked)
        assert result.returncode == 0, result.stdout[-4000:]
        assert calls_of(ontap) == first_run_calls(ontap, (9, 14, 1), root_volume_rule=True)
        assert [r["body"] for r in rule_posts(ontap, "default")] == [dict(ROOT_RULE, clients=NODES)]
        ontap.volume("kvcache")["nas"].update(uid=2470, gid=2470, unix_permissions=770)
        ontap.server.clear()
        result = run_playbook("ontap_nfs", asked)
        assert result.returncode == 0, result.stdout[-4000:]
        assert mutating(ontap) == []
    finally:
        ontap.stop()


def test_a_subnet_only_when_the_operator_names_it(ontap, run_playbook):
    """ontap_nfs_client_cidrs adds the named subnet to the nodes' host matches, nothing wider.

    Issue #33, failed on the role before it: it had no ontap_nfs_client_cidrs (the rule named the nodes only,
    by bare address).
    """
    result = run_playbook("ontap_nfs", role_vars(ontap, ontap_nfs_client_cidrs=["10.30.0.0/24"]))
    assert result.returncode == 0, result.stdout[-4000:]
    assert [r["body"] for r in rule_posts(ontap, "kvcache")] == [dict(TIER_RULE, clients=NODES + [{"match": "10.30.0.0/24"}])]
    assert rule_posts(ontap, "default") == []


@pytest.mark.parametrize("bad, says", [
    ({"ontap_nfs_client_cidrs": ["0.0.0.0/0"]}, "ontap_nfs_client_cidrs '0.0.0.0/0' lets in every IPv4 host"),
    ({"ontap_nfs_client_cidrs": ["10.0.0.0/8"]}, "ontap_nfs_client_cidrs '10.0.0.0/8' is wider than /16"),
    ({"ontap_nfs_client_cidrs": ["::/0"]}, "ontap_nfs_client_cidrs '::/0' lets in every IPv6 host"),
    ({"ontap_nfs_clients": ["10.30.0.0/24"]}, "ontap_nfs_clients item '10.30.0.0/24' is a subnet"),
    ({"ontap_nfs_client_address": "10.30.0.0/24"}, "gpu-a's ontap_nfs_client_address '10.30.0.0/24' is a subnet"),
    ({"ontap_nfs_clients": ["@gpu-netgroup"]}, "ontap_nfs_clients item '@gpu-netgroup' is not an IPv4 or IPv6 address"),
], ids=["all-ipv4", "slash-8", "all-ipv6", "subnet-as-client", "subnet-as-node-address", "netgroup"])
def test_export_clients_wider_than_the_nodes_are_refused(ontap, run_playbook, bad, says):
    """Issue #33: a subnet only when named in ontap_nfs_client_cidrs, never 0.0.0.0/0 or wider than the floor;
    node addresses are addresses. Refused before any request, naming the host, the variable and the fix.

    Failed on the role before it: each of these was exported to as given (or ontap_nfs_client_cidrs ignored).
    """
    result = run_playbook("ontap_nfs", role_vars(ontap, **bad))
    out = flat(result.stdout)
    assert result.returncode != 0, out[-3000:]
    assert ontap.server.requests == []
    assert "Host controller: the tier's export rule would let in more than the GPU nodes" in out
    assert says in out and "Fix:" in out
    assert PASSWORD not in result.stdout + result.stderr


def test_tls_with_the_site_ca(ontap, run_playbook):
    """validate_certs true: fails naming ontap_nfs_ca_bundle without the CA, passes with it.

    Failed on the old role: it had no way to give the netapp.ontap modules a CA.
    """
    checked = dict(TCP, ontap_nfs_validate_certs=True)
    result = run_playbook("ontap_nfs", role_vars(ontap, **checked))
    assert result.returncode != 0
    assert "set ontap_nfs_ca_bundle" in flat(result.stdout)
    result = run_playbook("ontap_nfs", role_vars(ontap, ontap_nfs_ca_bundle=ontap.server.ca_file, **checked))
    assert result.returncode == 0, result.stdout[-4000:]
    assert "POST /api/storage/volumes" in calls_of(ontap)


@pytest.mark.parametrize("bad, says", [
    ({"ontap_nfs_svm": "svm_kvv"}, "has no SVM named 'svm_kvv'"),
    ({"ontap_nfs_aggregate": "aggr9"}, "has no aggregate aggr9"),
    ({"ontap_nfs_rdma_lifs": ["no_such_lif"]}, "data LIF no_such_lif of SVM svm_kv was not found"),
], ids=["svm", "aggregate", "lif"])
def test_what_the_cluster_lacks_is_refused_before_any_change(ontap, run_playbook, bad, says):
    result = run_playbook("ontap_nfs", role_vars(ontap, **bad))
    assert result.returncode != 0
    assert says in flat(result.stdout) and "Fix:" in flat(result.stdout)
    assert mutating(ontap) == []
    assert PASSWORD not in result.stdout + result.stderr


@pytest.mark.parametrize("bad, variable", [
    ({"ontap_nfs_password": ""}, "ontap_nfs_password"),
    ({"ontap_nfs_hostname": "https://cluster.example.com"}, "ontap_nfs_hostname"),
    ({"ontap_nfs_aggregate": ""}, "ontap_nfs_aggregate"),
    ({"ontap_nfs_volume_size_gb": 100, "ontap_nfs_min_size_gb": 500}, "ontap_nfs_min_size_gb"),
    ({"ontap_nfs_junction_path": "kvcache"}, "ontap_nfs_junction_path"),
    ({"ontap_nfs_clients": ["10.30.0.0/24 rw"]}, "ontap_nfs_clients"),
    ({"ontap_nfs_max_transfer_size": 300000}, "ontap_nfs_max_transfer_size"),
    ({"ontap_nfs_max_transfer_size": 65536, "kvcache_mount_rsize": 262144}, "kvcache_mount_rsize"),
])
def test_bad_input_fails_before_any_request(ontap, run_playbook, bad, variable):
    result = run_playbook("ontap_nfs", role_vars(ontap, **bad))
    assert result.returncode != 0
    assert ontap.server.requests == []
    assert "Host controller" in flat(result.stdout)
    assert variable in flat(result.stdout)
    assert "Fix:" in flat(result.stdout)
    assert PASSWORD not in result.stdout + result.stderr


@pytest.mark.parametrize("playbook", [None, "playbooks/preflight.yml"], ids=["role", "preflight"])
def test_rdma_mounts_without_an_rdma_lif_are_refused(ontap, run_playbook, playbook):
    """Issue #34 defect 2: the nodes mount with proto=rdma (kvcache_mount_proto, rdma by default)
    but ontap_nfs_rdma_lifs is empty (inventories/example shipped both): no LIF gets RDMA, the
    SVM's RDMA transport stays off, and every node's mount is refused. The role (and preflight,
    which runs its checks) refuses it before any request, naming the nodes, both variables and
    the fix.

    Failed on the old role: it configured the SVM without RDMA and said nothing.
    """
    result = run_playbook("ontap_nfs", role_vars(ontap, ontap_nfs_rdma_lifs=[]),
                          playbook=os.path.join(ROOT, playbook) if playbook else None,
                          limit="controller" if playbook else None)
    out = flat(result.stdout)
    assert result.returncode != 0, out[-3000:]
    assert ontap.server.requests == []
    for fragment in ("Host controller: ontap_nfs_rdma_lifs is empty", "node(s) gpu-a, gpu-b mount the tier with "
                     "kvcache_mount_proto rdma", "Fix: list the SVM's data LIFs", "set kvcache_mount_proto: tcp"):
        assert fragment in out, (fragment, out[-3000:])
    assert PASSWORD not in result.stdout + result.stderr


def test_the_example_inventory_pairs_its_mount_protocol_with_its_rdma_lifs():
    """inventories/example as shipped: RDMA mounts with an RDMA LIF to fill in (the documented edit)."""
    with open(os.path.join(ROOT, "inventories", "example", "group_vars", "all", "storage.yml"), encoding="utf-8") as f:
        storage = yaml.safe_load(f)
    assert storage["kvcache_mount_proto"] == "rdma"
    assert storage["ontap_nfs_rdma_lifs"] and all(isinstance(lif, str) and lif for lif in storage["ontap_nfs_rdma_lifs"])


def test_an_rdma_lif_takes_rdma_mounts(ontap, run_playbook):
    """The fix the refusal names: with the LIF listed, the role enables the SVM's RDMA transport and
    roce on the LIF (the double's LIF request carries rdma_protocols)."""
    result = run_playbook("ontap_nfs", role_vars(ontap, ontap_nfs_rdma_lifs=["kv_data1"]))
    assert result.returncode == 0, result.stdout[-4000:]
    lif = [r for r in mutating(ontap) if r.call.startswith("PATCH /api/network/ip/interfaces/")]
    assert [r["body"] for r in lif] == [{"rdma_protocols": ["roce"]}]
    assert ontap.lif("kv_data1")["rdma_protocols"] == ["roce"]
    assert ontap.nfs_service()["transport"]["rdma_enabled"] is True
