"""ontap_nfs with NFS Kerberos (issue #33 item 1) against the ONTAP REST test double: the realm,
the UNIX users the principals map to, Kerberos on the data LIFs, the NFSv4 ID domain and a
krb5p-only export rule; a rerun changes nothing; bad input is refused before any request; and
the double itself refuses what ONTAP refuses (an SPN of a realm the SVM lacks, an enable with no
way to get the SPN's keys, a realm without its KDC).

Wall time: about 60 s (six ansible-playbook runs against the double on loopback).
"""
import json
import ssl
import urllib.error
import urllib.request

import pytest

from tests.doubles.ontap_rest import OntapDouble
from tests.integration.conftest import flat, recap
from tests.integration.test_ontap_nfs import (NODES, OLD_RELEASE, PASSWORD, TCP, let_clients_through_the_root_volume,
                                              mutating, role_vars)

KDC_PASSWORD = "kdc-admin-password-456"
KERBEROS = dict(TCP, kvcache_nfs_security="krb5p", kvcache_nfs_kerberos_realm="EXAMPLE.COM",
                kvcache_nfs_kerberos_kdc="10.30.0.2",
                ontap_nfs_kerberos_lifs=[{"name": "kv_data1", "fqdn": "kv-data1.storage.example.com"}],
                ontap_nfs_kerberos_admin_username="kadmin/admin", ontap_nfs_kerberos_admin_password=KDC_PASSWORD)


@pytest.fixture
def ontap(tls_dir):
    double = OntapDouble(tls_dir, version=(9, 14, 1)).start()
    let_clients_through_the_root_volume(double)
    yield double
    double.stop()


def test_kerberos_first_run_and_rerun(ontap, run_playbook):
    """Failed on the role before it: no realm, no UNIX users, no Kerberos on any LIF, and the
    export rule said sys whatever the fleet's security."""
    result = run_playbook("ontap_nfs", role_vars(ontap, **KERBEROS))
    assert result.returncode == 0, result.stdout[-4000:]
    by_call = {}
    for request in mutating(ontap):
        by_call.setdefault(request.call, []).append(request["body"])
    svm_uuid = ontap.svm["uuid"]
    assert by_call["POST /api/protocols/nfs/services"][0]["protocol.v4_id_domain"] == "example.com"
    assert by_call["POST /api/protocols/nfs/kerberos/realms"] == [
        {"name": "EXAMPLE.COM", "svm.name": "svm_kv", "kdc.ip": "10.30.0.2", "kdc.vendor": "other", "kdc.port": 88}]
    assert by_call["POST /api/name-services/unix-groups"] == [{"svm.name": "svm_kv", "name": "kvcache", "id": 2470}]
    assert sorted(by_call["POST /api/name-services/unix-users"], key=lambda b: b["name"]) == [
        {"svm.name": "svm_kv", "name": "kvcache", "id": 2470, "primary_gid": 2470},
        {"svm.name": "svm_kv", "name": "nfs", "id": 500, "primary_gid": 0}]
    lif_uuid = ontap.lif("kv_data1")["uuid"]
    assert by_call["PATCH /api/protocols/nfs/kerberos/interfaces/" + lif_uuid] == [
        {"enabled": True, "spn": "nfs/kv-data1.storage.example.com@EXAMPLE.COM", "user": "kadmin/admin",
         "password": KDC_PASSWORD}]
    rule = by_call["POST /api/protocols/nfs/export-policies/%d/rules" % ontap.policy("kvcache")["id"]][0]
    assert rule == {"protocols": ["nfs4"], "superuser": ["none"], "ro_rule": ["krb5p"], "rw_rule": ["krb5p"],
                    "clients": NODES}
    # What ONTAP holds now; the KDC administrator's password is not kept (write-only) nor printed.
    assert ontap.krb_interface("kv_data1")["enabled"] is True
    assert ontap.krb_interface("kv_data2")["enabled"] is False
    assert ontap.realm("EXAMPLE.COM")["svm"]["uuid"] == svm_uuid
    assert ontap.unix_user("kvcache")["id"] == 2470
    assert KDC_PASSWORD not in json.dumps(ontap.krb_interfaces)
    for secret in (PASSWORD, KDC_PASSWORD):
        assert secret not in result.stdout + result.stderr

    ontap.volume("kvcache")["nas"].update(uid=2470, gid=2470, unix_permissions=770)
    ontap.server.clear()
    result = run_playbook("ontap_nfs", role_vars(ontap, **KERBEROS))
    assert result.returncode == 0, result.stdout[-4000:]
    assert mutating(ontap) == []
    assert recap(result.stdout)["changed"] == 0


@pytest.mark.parametrize("bad, says", [
    ({"kvcache_nfs_kerberos_realm": ""}, "kvcache_nfs_kerberos_realm is"),
    ({"kvcache_nfs_kerberos_realm": "example.com"}, "a realm in upper case"),
    ({"kvcache_nfs_kerberos_kdc": ""}, "kvcache_nfs_kerberos_kdc is empty"),
    ({"ontap_nfs_kerberos_lifs": []}, "ontap_nfs_kerberos_lifs is empty"),
    ({"ontap_nfs_kerberos_lifs": [{"name": "kv_data1", "fqdn": "10.30.0.5"}]}, "not an address"),
    ({"ontap_nfs_kerberos_admin_password": ""}, "ontap_nfs_kerberos_keytab_uri"),
    ({"ontap_nfs_kerberos_kdc_vendor": "microsoft"}, "ontap_nfs_kerberos_ad_server_name"),
    ({"ontap_nfs_rule_rw": ["krb5p", "sys"]}, "still lets AUTH_SYS in"),
    ({"ontap_nfs_rdma_lifs": ["kv_data1"], "kvcache_mount_proto": "rdma"}, "no Kerberos over NFS over RDMA"),
], ids=["no-realm", "lower-case-realm", "no-kdc", "no-lifs", "lif-address", "no-keys", "ad-server", "sys-rule", "rdma"])
def test_kerberos_without_what_ontap_needs_is_refused_before_any_request(ontap, run_playbook, bad, says):
    result = run_playbook("ontap_nfs", role_vars(ontap, **dict(KERBEROS, **bad)))
    out = flat(result.stdout)
    assert result.returncode != 0, out[-3000:]
    assert ontap.server.requests == []
    assert "Host controller: kvcache_nfs_security is krb5p, but" in out and says in out and "Fix:" in out, out[-3000:]
    for secret in (PASSWORD, KDC_PASSWORD):
        assert secret not in result.stdout + result.stderr


def test_kerberos_over_rdma_when_the_operator_confirmed_it(ontap, run_playbook):
    """kvcache_nfs_kerberos_over_rdma: the operator has NetApp's word for the release."""
    extra = dict(KERBEROS, ontap_nfs_rdma_lifs=["kv_data1"], kvcache_mount_proto="rdma",
                 kvcache_nfs_kerberos_over_rdma=True)
    result = run_playbook("ontap_nfs", role_vars(ontap, **extra))
    assert result.returncode == 0, result.stdout[-4000:]
    assert ontap.krb_interface("kv_data1")["enabled"] is True
    assert ontap.lif("kv_data1")["rdma_protocols"] == ["roce"]


def test_kerberos_on_a_release_the_realm_module_cannot_read_is_refused_before_any_change(tls_dir, run_playbook):
    """netapp.ontap 23.x reads a realm with fields of ONTAP 9.13.1 (the double at 9.12.1 refuses
    them, as the cluster does). Failed before the release gate: the NFS service was created, then
    the realm module failed with ONTAP's 'invalid for field "fields"'."""
    ontap = OntapDouble(tls_dir, version=(9, 12, 1)).start()
    try:
        let_clients_through_the_root_volume(ontap)
        result = run_playbook("ontap_nfs", role_vars(ontap, **dict(KERBEROS, **OLD_RELEASE)))
        out = flat(result.stdout)
        assert result.returncode != 0, out[-3000:]
        assert mutating(ontap) == []
        assert "runs ONTAP 9.12.1: netapp.ontap's Kerberos realm module reads fields ONTAP has from 9.13.1" in out, out[-3000:]
    finally:
        ontap.stop()


def call(ontap, method, path, body=None):
    """One request to the double as ONTAP's REST client sends it; (status, JSON answer)."""
    context = ssl.create_default_context(cafile=ontap.server.ca_file)
    request = urllib.request.Request("https://localhost:%d%s" % (ontap.server.port, path), method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


@pytest.mark.parametrize("method, path, body, status, says", [
    # A realm needs its KDC; the vendor is ONTAP's enum; AD needs the AD server.
    ("POST", "/api/protocols/nfs/kerberos/realms", {"svm": {"name": "svm_kv"}, "name": "EXAMPLE.COM"}, 400,
     'Missing value for field "kdc.ip"'),
    ("POST", "/api/protocols/nfs/kerberos/realms",
     {"svm": {"name": "svm_kv"}, "name": "EXAMPLE.COM", "kdc": {"ip": "10.30.0.2", "vendor": "mit"}}, 400,
     'is an invalid value for field "kdc.vendor"'),
    ("POST", "/api/protocols/nfs/kerberos/realms",
     {"svm": {"name": "svm_kv"}, "name": "EXAMPLE.COM", "kdc": {"ip": "10.30.0.2", "vendor": "microsoft"}}, 400,
     '"ad_server.name" is required'),
    # Enabling a LIF: an SPN of a realm the SVM has, and a way to get its keys.
    ("PATCH", "/api/protocols/nfs/kerberos/interfaces/{lif}",
     {"enabled": True, "spn": "nfs/kv-data1.storage.example.com@EXAMPLE.COM", "user": "a", "password": "b"}, 400,
     'Kerberos realm "EXAMPLE.COM" is not configured'),
    ("PATCH", "/api/protocols/nfs/kerberos/interfaces/{lif}",
     {"enabled": True, "spn": "kv-data1@EXAMPLE.COM", "user": "a", "password": "b"}, 400, "nfs/<host name>@<REALM>"),
    # A field the resource does not have (ONTAP's schema): refused.
    ("PATCH", "/api/protocols/nfs/kerberos/interfaces/{lif}", {"enabled": True, "realm": "EXAMPLE.COM"}, 400,
     'Unexpected argument "realm"'),
    ("POST", "/api/name-services/unix-users", {"svm": {"name": "svm_kv"}, "name": "kvcache", "id": 2470}, 400,
     'Missing value for field "primary_gid"'),
], ids=["realm-no-kdc", "realm-vendor", "realm-ad", "spn-unknown-realm", "spn-form", "unknown-field",
        "user-no-group"])
def test_the_double_refuses_what_ontap_refuses(ontap, method, path, body, status, says):
    path = path.format(lif=ontap.lif("kv_data1")["uuid"])
    got, answer = call(ontap, method, path, body)
    assert got == status, answer
    assert says in answer["error"]["message"], answer


def test_the_double_enables_a_lif_with_keys_from_a_keytab(ontap):
    """The keytab path: a realm, then the LIF's enable with keytab_uri and no administrator."""
    assert call(ontap, "POST", "/api/protocols/nfs/kerberos/realms",
                {"svm": {"name": "svm_kv"}, "name": "EXAMPLE.COM", "kdc": {"ip": "10.30.0.2", "vendor": "other"}})[0] == 201
    lif = ontap.lif("kv_data1")["uuid"]
    status, answer = call(ontap, "PATCH", "/api/protocols/nfs/kerberos/interfaces/" + lif,
                          {"enabled": True, "spn": "nfs/kv-data1.storage.example.com@EXAMPLE.COM"})
    assert status == 400 and "keytab URI" in answer["error"]["message"], answer
    status, answer = call(ontap, "PATCH", "/api/protocols/nfs/kerberos/interfaces/" + lif,
                          {"enabled": True, "spn": "nfs/kv-data1.storage.example.com@EXAMPLE.COM",
                           "keytab_uri": "https://kdc.example.com/kv-data1.keytab"})
    assert status == 200, answer
    status, answer = call(ontap, "GET", "/api/protocols/nfs/kerberos/interfaces/%s?fields=enabled,spn" % lif)
    assert answer["enabled"] is True and answer["spn"] == "nfs/kv-data1.storage.example.com@EXAMPLE.COM", answer
