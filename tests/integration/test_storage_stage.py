"""The storage stage (playbooks/storage.yml, as site.yml runs it) against both doubles:
ONTAP 9.19.1 and a freshly installed StorageGRID 11.8. After the nodes stage has made the
tier its service user's, a rerun of the stage changes nothing on either appliance."""
import os

import pytest

from tests.doubles.ontap_rest import OntapDouble
from tests.doubles.storagegrid_rest import StorageGridDouble
from tests.integration.conftest import ROOT, fleet_default, recap


@pytest.fixture
def appliances(tls_dir):
    ontap = OntapDouble(tls_dir, version=(9, 19, 1)).start()
    # The storage team's read-only rule in the SVM root volume's policy (the role adds none by default).
    ontap._create_rules({"clients": [{"match": "10.30.0.0/24"}], "protocols": ["nfs4"], "ro_rule": ["sys"],
                         "rw_rule": ["never"], "superuser": ["none"]}, ontap.policy("default"))
    grid = StorageGridDouble(tls_dir, version="11.8.0").start()
    yield ontap, grid
    ontap.stop()
    grid.stop()


def stage_vars(ontap, grid, tmp_path):
    url = "https://localhost:%d" % grid.server.port
    return {
        # Both appliances' certificates are checked against the site CA.
        "ontap_nfs_hostname": "127.0.0.1", "ontap_nfs_http_port": ontap.server.port,
        "ontap_nfs_ca_bundle": ontap.server.ca_file,
        "ontap_nfs_username": "admin", "ontap_nfs_password": "double-password-123",
        "ontap_nfs_svm": "svm_kv", "ontap_nfs_aggregate": "aggr1", "ontap_nfs_volume_size_gb": 200,
        "ontap_nfs_rdma_lifs": ["kv_data1"],
        "kvcache_s3_bucket": "kvcache", "kvcache_s3_endpoint": url,
        "storagegrid_s3_ca_bundle": grid.server.ca_file,
        "storagegrid_s3_tenant_api_url": url, "storagegrid_s3_tenant_account_id": grid.account_id,
        "storagegrid_s3_tenant_username": grid.username, "storagegrid_s3_tenant_password": grid.password,
        "storagegrid_s3_key_user": "user/kvcache", "storagegrid_s3_create_key": True,
        "storagegrid_s3_key_file": str(tmp_path / "kvcache-s3-key.json"),
        "storagegrid_s3_vhost_check_hosts": [],
    }


def test_storage_stage_rerun_after_the_nodes_stage_changes_nothing(appliances, run_playbook, tmp_path):
    """Failed on the old roles: the ONTAP volume went back to root:root on the rerun (and a
    fresh 11.8 grid refused the old role's /api/v3 calls)."""
    ontap, grid = appliances
    run = dict(playbook=os.path.join(ROOT, "playbooks", "storage.yml"), limit="kvcache_storage_controllers")
    result = run_playbook("storage_stage", stage_vars(ontap, grid, tmp_path), **run)
    assert result.returncode == 0, result.stdout[-4000:]
    assert ontap.volume("kvcache") and grid.containers and grid.lifecycle
    # Issue #33: the tier's export rule squashes root and names each node by a host match; the root
    # volume's policy is left alone. Failed on the roles before it: superuser sys, bare addresses, and
    # a second rule in `default`.
    rules = {ontap.policy(p)["id"]: p for p in ("kvcache", "default")}
    posted = [(rules[int(r.call.split("/")[-2])], r["body"]) for r in ontap.server.requests
              if r["method"] == "POST" and r.call.endswith("/rules")]
    assert posted == [("kvcache", {"protocols": ["nfs4"], "superuser": ["none"], "ro_rule": ["sys"], "rw_rule": ["sys"],
                                   "clients": [{"match": "10.30.0.21/32"}, {"match": "10.30.0.22/32"}]})]

    # The nodes stage: kvcache_mount (storage play) gives the mounted root to the service user.
    ontap.volume("kvcache")["nas"].update(uid=fleet_default("kvcache_service_uid"),
                                          gid=fleet_default("kvcache_service_gid"), unix_permissions=770)
    ontap.server.clear()
    grid.server.clear()
    result = run_playbook("storage_stage", stage_vars(ontap, grid, tmp_path), **run)
    assert result.returncode == 0, result.stdout[-4000:]
    assert recap(result.stdout)["changed"] == 0
    assert ontap.server.calls(mutating_only=True) == []
    assert grid.server.calls(mutating_only=True) == ["POST /api/v4/authorize"]
