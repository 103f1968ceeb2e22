"""ontap_nfs against the ONTAP REST test double: exact call sequence, payloads, idempotence,
secrets kept out of the output, and bad input refused before any request."""
import pytest

from tests.doubles.ontap_rest import OntapDouble
from tests.integration.conftest import flat, recap

PASSWORD = "double-password-123"


@pytest.fixture
def ontap(tls_dir):
    double = OntapDouble(tls_dir, aggregate="aggr1").start()
    yield double
    double.stop()


def role_vars(ontap, **extra):
    data = {
        "ontap_nfs_hostname": "127.0.0.1",
        "ontap_nfs_http_port": ontap.server.port,
        "ontap_nfs_validate_certs": False,  # the test double's throw-away certificate only
        "ontap_nfs_username": "admin",
        "ontap_nfs_password": PASSWORD,
        "ontap_nfs_svm": "svm_kv",
        "ontap_nfs_aggregate": "aggr1",
        "ontap_nfs_volume_size_gb": 200,
        "ontap_nfs_rdma_lifs": ["kv_data1"],
    }
    data.update(extra)
    return data


LIF_UUID_PATH = "/api/network/ip/interfaces/7701f093-aac1-5979-b74f-86c5119d66f1"

# What the real netapp.ontap 23.x modules send for a fresh SVM, in order.
FIRST_RUN = [
    "GET /api/cluster",
    "GET /api/protocols/nfs/services",
    "POST /api/protocols/nfs/services",
    "GET /api/cluster",
    "GET /api/protocols/nfs/export-policies/",
    "POST /api/protocols/nfs/export-policies",
    "GET /api/cluster",
    "GET /api/protocols/nfs/export-policies",
    "GET /api/protocols/nfs/export-policies/1001/rules/1",
    "GET /api/protocols/nfs/export-policies/1001/rules",
    "POST /api/protocols/nfs/export-policies/1001/rules",
    "PATCH /api/protocols/nfs/export-policies/1001/rules/1",
    "GET /api/cluster",
    "GET /api/storage/volumes",
    "GET /api/svm/svms",
    "POST /api/storage/volumes",
    "GET /api/cluster/jobs/e111a242-f5f4-507c-b398-3a69685d0c64",
    "GET /api/storage/volumes",
    "GET /api/storage/volumes",
    "GET /api/network/ip/interfaces",
    "PATCH " + LIF_UUID_PATH,
]


def mutating(ontap):
    return [r for r in ontap.server.requests if r["method"] not in ("GET", "HEAD")]


def test_first_run_sends_the_exact_sequence_and_payloads(ontap, run_playbook):
    result = run_playbook("ontap_nfs", role_vars(ontap))
    assert result.returncode == 0, result.stdout[-4000:]
    assert ontap.server.calls() == FIRST_RUN
    assert recap(result.stdout)["changed"] == 5

    service, policy, rule, rule_index, volume, lif = mutating(ontap)
    assert service["body"] == {"svm.name": "svm_kv", "protocol.v41_enabled": "true",
                               "protocol.v41_features.pnfs_enabled": "true", "enabled": "true"}
    assert policy["body"] == {"name": "kvcache", "svm.name": "svm_kv"}
    # One rule for both GPU nodes, from the kvcache_nodes group's ansible_host.
    assert rule["body"] == {"protocols": ["nfs4"], "superuser": ["sys"], "ro_rule": ["sys"], "rw_rule": ["sys"],
                            "clients": [{"match": "10.20.0.21"}, {"match": "10.20.0.22"}]}
    assert rule_index["query"]["new_index"] == "1"
    assert volume["body"] == {
        "name": "kvcache", "svm.name": "svm_kv", "aggregates": [{"name": "aggr1"}],
        "size": 200 * 1024 ** 3, "snapshot_policy.name": "none", "nas.unix_permissions": "770",
        "nas.gid": 0, "nas.uid": 0, "nas.security_style": "unix", "nas.export_policy.name": "kvcache",
        "nas.path": "/kvcache", "state": "online",
    }
    assert lif["body"] == {"rdma_protocols": ["roce"]}

    # Every call authenticated as the configured user, over HTTPS.
    assert ontap.server.scheme == "https"
    assert all(r["user"] == ["admin", PASSWORD] for r in ontap.server.requests)
    # The password never reaches the output.
    assert PASSWORD not in result.stdout + result.stderr


def test_second_run_changes_nothing(ontap, run_playbook):
    assert run_playbook("ontap_nfs", role_vars(ontap)).returncode == 0
    ontap.server.clear()
    result = run_playbook("ontap_nfs", role_vars(ontap))
    assert result.returncode == 0, result.stdout[-4000:]
    assert mutating(ontap) == []
    assert recap(result.stdout)["changed"] == 0


def test_existing_nfs_service_is_patched_not_recreated(ontap, run_playbook):
    ontap.collections["/api/protocols/nfs/services"].append({
        "svm": dict(ontap.svm), "enabled": True, "state": "online",
        "protocol": {"v3_enabled": True, "v40_enabled": False, "v41_enabled": False,
                     "v41_features": {"pnfs_enabled": False}},
    })
    result = run_playbook("ontap_nfs", role_vars(ontap, ontap_nfs_rdma_lifs=[]))
    assert result.returncode == 0, result.stdout[-4000:]
    first = mutating(ontap)[0]
    assert first.call == "PATCH /api/protocols/nfs/services/" + ontap.svm["uuid"]
    assert first["body"] == {"protocol.v41_enabled": "true", "protocol.v41_features.pnfs_enabled": "true"}
    assert "PATCH /api/network/ip/interfaces" not in " ".join(ontap.server.calls())


def test_flexgroup_spreads_over_the_aggregates(ontap, run_playbook):
    ontap.collections["/api/storage/aggregates"].append({"name": "aggr2", "uuid": "aggr2-uuid"})
    result = run_playbook("ontap_nfs", role_vars(
        ontap, ontap_nfs_flexgroup=True, ontap_nfs_aggregate="", ontap_nfs_flexgroup_aggregates=["aggr1", "aggr2"],
        ontap_nfs_rdma_lifs=[], ontap_nfs_clients=["10.20.0.0/24"]))
    assert result.returncode == 0, result.stdout[-4000:]
    volume = [r for r in mutating(ontap) if r.call == "POST /api/storage/volumes"][0]
    assert volume["body"]["aggregates"] == [{"name": "aggr1"}, {"name": "aggr2"}]
    assert volume["body"]["constituents_per_aggregate"] == 4
    rule = [r for r in mutating(ontap) if r.call.endswith("/rules")][0]
    assert rule["body"]["clients"] == [{"match": "10.20.0.0/24"}]


@pytest.mark.parametrize("bad, variable", [
    ({"ontap_nfs_password": ""}, "ontap_nfs_password"),
    ({"ontap_nfs_hostname": "https://cluster.example.com"}, "ontap_nfs_hostname"),
    ({"ontap_nfs_aggregate": ""}, "ontap_nfs_aggregate"),
    ({"ontap_nfs_volume_size_gb": 100, "ontap_nfs_min_size_gb": 500}, "ontap_nfs_min_size_gb"),
    ({"ontap_nfs_junction_path": "kvcache"}, "ontap_nfs_junction_path"),
    ({"ontap_nfs_clients": []}, "ontap_nfs_clients"),
])
def test_bad_input_fails_before_any_request(ontap, run_playbook, bad, variable):
    result = run_playbook("ontap_nfs", role_vars(ontap, **bad))
    assert result.returncode != 0
    assert ontap.server.requests == []
    assert "Host controller" in flat(result.stdout)
    assert variable in flat(result.stdout)
    assert "Fix:" in flat(result.stdout)
    assert PASSWORD not in result.stdout + result.stderr


def test_cluster_error_is_reported_with_a_fix(ontap, run_playbook):
    result = run_playbook("ontap_nfs", role_vars(ontap, ontap_nfs_rdma_lifs=["no_such_lif"]))
    assert result.returncode != 0
    assert "no_such_lif" in flat(result.stdout) and "Fix:" in flat(result.stdout)
    assert not any(r.call.startswith("PATCH /api/network") for r in ontap.server.requests)
    assert PASSWORD not in result.stdout + result.stderr
