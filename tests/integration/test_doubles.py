"""The ONTAP and StorageGRID test doubles refuse what the appliances refuse.

Straight HTTPS requests (no Ansible), so each refusal is proved on its own: a typo'd
SVM, a missing aggregate, an unknown field, an unknown `fields=` value, a wrong type, a
field an operation may not set, a field or feature newer than the claimed release, an
API version the grid does not enable, a lifecycle element StorageGRID does not take.
"""
import base64
import hashlib
import json
import ssl
import urllib.error
import urllib.request
from urllib.parse import urlencode

import pytest

from tests.doubles.ontap_rest import OntapDouble
from tests.doubles.storagegrid_rest import TOKEN, StorageGridDouble, check_lifecycle

NS = 'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'


def call(server, method, path, query=None, body=None, headers=None):
    """(status, parsed JSON or text) of one request, the certificate checked against the double's CA."""
    url = "https://127.0.0.1:%d%s" % (server.port, path) + ("?" + urlencode(query) if query else "")
    data = None
    headers = dict(headers or {})
    if isinstance(body, (dict, list)):
        data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
    elif body is not None:
        data = body.encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    context = ssl.create_default_context(cafile=server.ca_file)
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            status, raw = answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read().decode()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


@pytest.fixture
def ontap_at(tls_dir):
    started = []

    def start(version=(9, 14, 1)):
        double = OntapDouble(tls_dir, version=version).start()
        started.append(double)
        return double

    yield start
    for double in started:
        double.stop()


def volume_body(**changes):
    body = {"name": "kvcache", "svm": {"name": "svm_kv"}, "aggregates": [{"name": "aggr1"}], "size": 1024 ** 3,
            "nas": {"path": "/kvcache", "uid": 2470, "gid": 2470, "unix_permissions": "770"}}
    body.update(changes)
    return body


def test_ontap_double_accepts_a_well_formed_volume(ontap_at):
    ontap = ontap_at()
    status, answer = call(ontap.server, "POST", "/api/storage/volumes", body=volume_body())
    assert status == 202 and "job" in answer
    status, answer = call(ontap.server, "GET", "/api/storage/volumes",
                          {"name": "kvcache", "svm.name": "svm_kv", "fields": "nas.uid,aggregates.name,space.size"})
    assert status == 200
    record = answer["records"][0]
    assert record["nas"] == {"uid": 2470} and record["aggregates"] == [{"name": "aggr1"}]
    assert record["space"] == {"size": 1024 ** 3}


@pytest.mark.parametrize("what, request_, status, code, text", [
    ("typo'd SVM", ("POST", "/api/storage/volumes", None, volume_body(svm={"name": "svm_kvv"})),
     400, "2621462", 'SVM "svm_kvv" does not exist'),
    ("missing aggregate", ("POST", "/api/storage/volumes", None, volume_body(aggregates=[{"name": "aggr9"}])),
     400, None, 'Aggregate "aggr9" does not exist'),
    ("unknown body field", ("POST", "/api/storage/volumes", None, volume_body(nas={"unix_permission": "770"})),
     400, "262179", 'Unexpected argument "nas.unix_permission".'),
    ("unknown dotted body field", ("POST", "/api/protocols/nfs/services", None,
                                   {"svm.name": "svm_kv", "protocol.v41_feature.pnfs_enabled": True}),
     400, "262179", 'Unexpected argument "protocol.v41_feature".'),
    ("wrong type", ("POST", "/api/storage/volumes", None, volume_body(name=5)),
     400, "262196", 'is an invalid value for field "name"'),
    ("wrong type of a size", ("POST", "/api/storage/volumes", None, volume_body(size="a lot")),
     400, "262196", 'is an invalid value for field "size"'),
    ("unknown fields= value", ("GET", "/api/storage/volumes", {"fields": "name,nas.uidd"}, None),
     400, "262197", 'The value "nas.uidd" is invalid for field "fields"'),
    ("unknown query field", ("GET", "/api/storage/volumes", {"svm.nam": "svm_kv"}, None),
     400, "262179", 'Unexpected argument "svm.nam".'),
    ("unknown API", ("GET", "/api/storage/volume", None, None), 404, "3", "API not found"),
    ("export policy that does not exist", ("POST", "/api/storage/volumes", None,
                                           volume_body(nas={"export_policy": {"name": "nfs_nodes"}})),
     400, None, 'Export policy "nfs_nodes" does not exist'),
])
def test_ontap_double_refuses_like_ontap(ontap_at, what, request_, status, code, text):
    ontap = ontap_at()
    method, path, query, body = request_
    got, answer = call(ontap.server, method, path, query, body)
    assert got == status, (what, answer)
    assert text in answer["error"]["message"], what
    if code:
        assert answer["error"]["code"] == code, what
    assert ontap.volume("kvcache") is None and ontap.nfs_services == []


def test_ontap_double_looks_svms_up_by_name(ontap_at):
    ontap = ontap_at()
    assert call(ontap.server, "GET", "/api/svm/svms", {"name": "svm_kvv", "fields": "uuid"})[1]["num_records"] == 0
    status, answer = call(ontap.server, "GET", "/api/svm/svms", {"name": "svm_kv", "fields": "uuid"})
    assert answer["records"] == [{"name": "svm_kv", "uuid": ontap.svm["uuid"]}]
    # The same for everything scoped to an SVM: a typo finds nothing.
    assert call(ontap.server, "GET", "/api/network/ip/interfaces", {"svm.name": "svm_kvv"})[1]["num_records"] == 0


def test_ontap_double_refuses_what_a_patch_may_not_set(ontap_at):
    ontap = ontap_at()
    call(ontap.server, "POST", "/api/storage/volumes", body=volume_body())
    uuid = ontap.volume("kvcache")["uuid"]
    status, answer = call(ontap.server, "PATCH", "/api/storage/volumes/" + uuid, body={"svm": {"name": "svm_kv"}})
    assert status == 400 and answer["error"]["code"] == "262186"


def test_ontap_double_models_the_svm_root_volume_and_its_policy(ontap_at):
    ontap = ontap_at()
    status, answer = call(ontap.server, "GET", "/api/storage/volumes",
                          {"svm.name": "svm_kv", "is_svm_root": "true", "fields": "nas.path,nas.export_policy.name"})
    assert answer["records"][0]["nas"] == {"path": "/", "export_policy": {"name": "default"}}
    policy = ontap.policy("default")
    assert call(ontap.server, "GET", "/api/protocols/nfs/export-policies/%d/rules" % policy["id"])[1]["num_records"] == 0


def test_ontap_double_embeds_a_policys_rules_like_ontap(ontap_at):
    """GET export-policies?fields=rules.index returns the policy's rules, as ONTAP does (the role's
    check that the SVM root volume's policy lets clients in reads them). Failed on the double before
    issue #33: the policy record had no rules, so that check refused every SVM."""
    ontap = ontap_at()
    query = {"svm.name": "svm_kv", "name": "default", "fields": "rules.index"}
    assert call(ontap.server, "GET", "/api/protocols/nfs/export-policies", query)[1]["records"][0].get("rules", []) == []
    ontap._create_rules({"clients": [{"match": "10.30.0.0/24"}], "ro_rule": ["sys"], "rw_rule": ["never"]},
                        ontap.policy("default"))
    assert call(ontap.server, "GET", "/api/protocols/nfs/export-policies", query)[1]["records"][0]["rules"] == [{"index": 1}]


def test_ontap_double_models_lif_and_aggregate_home_nodes(ontap_at):
    ontap = ontap_at()
    lifs = call(ontap.server, "GET", "/api/network/ip/interfaces",
                {"svm.name": "svm_kv", "fields": "name,rdma_protocols,location.home_node.name"})[1]["records"]
    assert {lif["name"]: lif["location"]["home_node"]["name"] for lif in lifs} == {"kv_data1": "node1", "kv_data2": "node2"}
    aggregates = call(ontap.server, "GET", "/api/storage/aggregates", {"fields": "home_node.name"})[1]["records"]
    assert {a["name"]: a["home_node"]["name"] for a in aggregates} == {"aggr1": "node1", "aggr2": "node2"}


@pytest.mark.parametrize("version", [(9, 10, 1), (9, 12, 1), (9, 14, 1), (9, 19, 1)])
def test_ontap_double_claims_its_release(ontap_at, version):
    ontap = ontap_at(version)
    answer = call(ontap.server, "GET", "/api/cluster", {"fields": "version"})[1]
    assert (answer["version"]["generation"], answer["version"]["major"], answer["version"]["minor"]) == version


def test_ontap_double_gates_fields_and_features_by_release(ontap_at):
    """Trunking's field came with 9.12.1 (netapp-ontap's schemas), the feature with 9.14.1 (NetApp)."""
    trunking = {"protocol": {"v41_features": {"trunking_enabled": True}}}
    answers = {}
    for version in ((9, 10, 1), (9, 12, 1), (9, 14, 1)):
        ontap = ontap_at(version)
        call(ontap.server, "POST", "/api/protocols/nfs/services", body={"svm": {"name": "svm_kv"}})
        answers[version] = (
            call(ontap.server, "PATCH", "/api/protocols/nfs/services/" + ontap.svm["uuid"], body=trunking),
            call(ontap.server, "GET", "/api/protocols/nfs/services",
                 {"fields": "transport.tcp_max_transfer_size"}))
    (patch, get) = answers[(9, 10, 1)]
    assert patch[0] == 400 and patch[1]["error"]["message"] == 'Unexpected argument "protocol.v41_features.trunking_enabled".'
    assert get[0] == 400 and get[1]["error"]["code"] == "262197"
    (patch, get) = answers[(9, 12, 1)]
    assert patch[0] == 400 and "not supported until the effective cluster version is 9.14.1" in patch[1]["error"]["message"]
    assert get[0] == 200 and get[1]["records"][0]["transport"] == {"tcp_max_transfer_size": 65536}
    (patch, get) = answers[(9, 14, 1)]
    assert patch[0] == 200


def test_ontap_double_returns_advanced_fields_only_when_named(ontap_at):
    ontap = ontap_at()
    call(ontap.server, "POST", "/api/protocols/nfs/services", body={"svm": {"name": "svm_kv"}})
    star = call(ontap.server, "GET", "/api/protocols/nfs/services", {"fields": "*"})[1]["records"][0]
    assert "trunking_enabled" not in star["protocol"]["v41_features"]
    named = call(ontap.server, "GET", "/api/protocols/nfs/services",
                 {"fields": "protocol.v41_features.trunking_enabled"})[1]["records"][0]
    assert named["protocol"] == {"v41_features": {"trunking_enabled": False}}


def test_ontap_double_refuses_a_transfer_size_ontap_refuses(ontap_at):
    ontap = ontap_at()
    status, answer = call(ontap.server, "POST", "/api/protocols/nfs/services",
                          body={"svm": {"name": "svm_kv"}, "transport": {"tcp_max_transfer_size": 300000}})
    assert status == 400 and "tcp_max_transfer_size" in answer["error"]["message"]


def test_ontap_double_checks_credentials_when_given(tls_dir):
    ontap = OntapDouble(tls_dir, credentials=("admin", "secret")).start()
    try:
        auth = "Basic " + base64.b64encode(b"admin:wrong").decode()
        assert call(ontap.server, "GET", "/api/cluster", headers={"Authorization": auth})[0] == 401
        auth = "Basic " + base64.b64encode(b"admin:secret").decode()
        assert call(ontap.server, "GET", "/api/cluster", headers={"Authorization": auth})[0] == 200
    finally:
        ontap.stop()


# -- StorageGRID ---------------------------------------------------------------------------------
@pytest.fixture
def grid_at(tls_dir):
    started = []

    def start(version="11.8.0", upgraded=False):
        double = StorageGridDouble(tls_dir, version=version, upgraded=upgraded).start()
        started.append(double)
        return double

    yield start
    for double in started:
        double.stop()


@pytest.mark.parametrize("version, upgraded, enabled", [
    ("11.7.0", False, [3]),
    ("11.8.0", False, [4]),
    ("11.8.0", True, [3, 4]),
    ("11.9.0", False, [4]),
])
def test_grid_double_enables_the_versions_of_its_release(grid_at, version, upgraded, enabled):
    grid = grid_at(version, upgraded)
    status, answer = call(grid.server, "GET", "/api/versions")
    assert status == 200 and answer["data"] == enabled
    login = {"accountId": grid.account_id, "username": grid.username, "password": grid.password}
    for api in (3, 4):
        status, answer = call(grid.server, "POST", "/api/v%d/authorize" % api, body=login)
        assert status == (200 if api in enabled else 404), (api, answer)
        if api not in enabled:
            assert answer["status"] == "error" and "not enabled" in answer["message"]["text"]


def lifecycle(rule_body):
    return "<LifecycleConfiguration %s><Rule><ID>r</ID><Status>Enabled</Status>%s</Rule></LifecycleConfiguration>" % (
        NS, rule_body)


@pytest.mark.parametrize("rule_body, refused", [
    ("<Filter><Prefix>a/</Prefix></Filter><Expiration><Days>7</Days></Expiration>", None),
    ("<Filter><And><Prefix>a/</Prefix><Tag><Key>k</Key><Value>v</Value></Tag></And></Filter>"
     "<Expiration><Date>2030-01-01T00:00:00Z</Date></Expiration>", None),
    ("<NoncurrentVersionExpiration><NoncurrentDays>3</NoncurrentDays></NoncurrentVersionExpiration>", None),
    ("<Expiration><Days>7</Days></Expiration>"
     "<AbortIncompleteMultipartUpload><DaysAfterInitiation>1</DaysAfterInitiation></AbortIncompleteMultipartUpload>",
     "AbortIncompleteMultipartUpload"),
    ("<Transition><Days>30</Days><StorageClass>GLACIER</StorageClass></Transition>", "Transition"),
    ("<Expiration><ExpiredObjectDeleteMarker>true</ExpiredObjectDeleteMarker></Expiration>", "ExpiredObjectDeleteMarker"),
    ("<Filter><ObjectSizeGreaterThan>10</ObjectSizeGreaterThan></Filter><Expiration><Days>1</Days></Expiration>",
     "ObjectSizeGreaterThan"),
    ("<Expiration><Days>0</Days></Expiration>", "positive"),
    ("<Filter><Prefix/></Filter>", "Expiration"),
])
def test_grid_double_takes_only_the_lifecycle_elements_storagegrid_documents(rule_body, refused):
    problem = check_lifecycle(lifecycle(rule_body))
    if refused is None:
        assert problem is None
    else:
        assert problem and refused in problem


def test_grid_double_refuses_a_lifecycle_put_it_does_not_take(grid_at):
    grid = grid_at()
    grid.containers.append({"name": "kvcache", "region": "us-east-1"})
    # a key of the tenant's administrator (root access: the double checks permissions too)
    admin = grid.users["user/" + grid.username]["id"]
    grid.keys["SGKEY1"] = {"owner": admin, "id": "key-1", "secret": "s"}
    signed = {"Authorization": "AWS4-HMAC-SHA256 Credential=SGKEY1/20260101/us-east-1/s3/aws4_request, Signature=0"}
    body = lifecycle("<Expiration><Days>7</Days></Expiration><AbortIncompleteMultipartUpload>"
                     "<DaysAfterInitiation>1</DaysAfterInitiation></AbortIncompleteMultipartUpload>")
    # The PUTs carry Content-MD5, as StorageGRID requires (issue #34 defect 8; without it: 400 InvalidRequest).
    status, answer = call(grid.server, "PUT", "/kvcache", {"lifecycle": ""}, body, dict(signed, **md5(body)))
    assert status == 400 and "<Code>MalformedXML</Code>" in answer and "AbortIncompleteMultipartUpload" in answer
    assert "kvcache" not in grid.lifecycle
    good = lifecycle("<Expiration><Days>7</Days></Expiration>")
    unsigned = {"Authorization": "AWS4-HMAC-SHA256 Credential=NOTAKEY/20260101/us-east-1/s3/aws4_request"}
    assert call(grid.server, "PUT", "/kvcache", {"lifecycle": ""}, good, dict(unsigned, **md5(good)))[0] == 403
    status, answer = call(grid.server, "PUT", "/kvcache", {"lifecycle": ""}, good, signed)
    assert status == 400 and "<Code>InvalidRequest</Code>" in answer and "Content-MD5" in answer
    status, answer = call(grid.server, "PUT", "/kvcache", {"lifecycle": ""}, good, dict(signed, **md5(body)))
    assert status == 400 and "<Code>BadDigest</Code>" in answer
    assert "kvcache" not in grid.lifecycle
    assert call(grid.server, "PUT", "/kvcache", {"lifecycle": ""}, good, dict(signed, **md5(good)))[0] == 200


def md5(body):
    """The Content-MD5 header of a request body."""
    return {"Content-MD5": base64.b64encode(hashlib.md5(body.encode()).digest()).decode()}


def test_grid_double_denies_a_key_whose_user_may_not(grid_at):
    """StorageGRID evaluates the key's owner: a user in no group may do nothing; a group policy
    that allows reading the rule does not allow changing it; root access may."""
    grid = grid_at()
    grid.containers.append({"name": "kvcache", "region": "us-east-1"})
    grid.keys["SGKEY2"] = {"owner": grid.users["user/kvcache"]["id"], "id": "key-2", "secret": "s"}
    signed = {"Authorization": "AWS4-HMAC-SHA256 Credential=SGKEY2/20260101/us-east-1/s3/aws4_request, Signature=0"}
    good = lifecycle("<Expiration><Days>7</Days></Expiration>")
    status, answer = call(grid.server, "PUT", "/kvcache", {"lifecycle": ""}, good, dict(signed, **md5(good)))
    assert status == 403 and "<Code>AccessDenied</Code>" in answer and "kvcache" not in grid.lifecycle
    grid.groups["g-read"] = {"id": "g-read", "uniqueName": "group/read", "displayName": "read", "policies": {
        "management": {}, "s3": {"Statement": [{"Effect": "Allow", "Action": "s3:GetLifecycleConfiguration",
                                                "Resource": "arn:aws:s3:::kvcache"}]}}}
    grid.users["user/kvcache"]["memberOf"] = ["g-read"]
    assert call(grid.server, "GET", "/kvcache", {"lifecycle": ""}, None, signed)[0] == 404  # allowed: no rule yet
    assert call(grid.server, "PUT", "/kvcache", {"lifecycle": ""}, good, dict(signed, **md5(good)))[0] == 403
    grid.users["user/kvcache"]["memberOf"] = ["00000000-0000-4000-8000-0000000000a1"]  # root access
    assert call(grid.server, "PUT", "/kvcache", {"lifecycle": ""}, good, dict(signed, **md5(good)))[0] == 200


def test_grid_double_refuses_unknown_bucket_fields(grid_at):
    grid = grid_at()
    bearer = {"Authorization": "Bearer " + TOKEN}
    status, answer = call(grid.server, "POST", "/api/v4/org/containers", body={"name": "kvcache", "versioning": True},
                          headers=bearer)
    assert status == 400 and answer["message"]["key"] == "invalidBody"
