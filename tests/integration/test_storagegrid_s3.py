"""storagegrid_s3 in tenant mode against the StorageGRID test double: the management API
version the grid enables, login, bucket, ONE S3 key created and reused (key file, then
vault), an expiration rule StorageGRID takes, TLS with a site CA, secrets kept out of the
output, and bad input refused before any request."""
import base64
import hashlib
import json
import os
import stat
import sys
import xml.etree.ElementTree as ET

import pytest

from tests.doubles.storagegrid_rest import TOKEN, StorageGridDouble
from tests.integration.conftest import ROOT, flat, recap

TENANT_PASSWORD = "double-tenant-password"
USER_ID = "00000000-0000-4000-8000-000000000077"
ADMIN_ID = "00000000-0000-4000-8000-0000000000ad"


@pytest.fixture
def grid(tls_dir):
    double = StorageGridDouble(tls_dir, password=TENANT_PASSWORD).start()
    yield double
    double.stop()


def grid_path(api, path):
    return "/api/v%d%s" % (api, path)


def role_vars(grid, tmp_path, **extra):
    url = "https://localhost:%d" % grid.server.port
    data = {
        "storagegrid_s3_bucket": "kvcache",
        "storagegrid_s3_endpoint": url,
        "storagegrid_s3_region": "us-east-1",
        "storagegrid_s3_access_key": "",
        "storagegrid_s3_secret_key": "",
        "storagegrid_s3_validate_certs": False,  # the test double's throw-away certificate only
        "storagegrid_s3_tenant_api_url": url,
        "storagegrid_s3_tenant_account_id": grid.account_id,
        "storagegrid_s3_tenant_username": grid.username,
        "storagegrid_s3_tenant_password": TENANT_PASSWORD,
        "storagegrid_s3_key_user": "user/kvcache",
        "storagegrid_s3_create_key": True,
        "storagegrid_s3_key_file": str(tmp_path / "kvcache-s3-key.json"),
        "storagegrid_s3_expiration_days": 3,
        "storagegrid_s3_vhost_check_hosts": [],
    }
    data.update(extra)
    return data


def mgmt_calls(grid):
    return [r.call + ("?" + "&".join(sorted(r["query"])) if r["query"] else "") for r in grid.server.requests]


def secrets_in(text, grid):
    found = [TENANT_PASSWORD, TOKEN] + [k["secret"] for k in grid.keys.values()]
    return [s for s in found if s in text]


def first_run(api):
    return [
        "GET /api/versions",
        "POST " + grid_path(api, "/authorize"),
        "GET " + grid_path(api, "/org/users/user/kvcache"),
        "GET " + grid_path(api, "/org/groups/group/kvcache-data-kvcache"),
        "POST " + grid_path(api, "/org/groups"),
        "PUT " + grid_path(api, "/org/users/%s" % USER_ID),
        "GET " + grid_path(api, "/org/containers"),
        "POST " + grid_path(api, "/org/containers"),
        "GET " + grid_path(api, "/org/containers/kvcache/versioning"),
        "POST " + grid_path(api, "/org/users/%s/s3-access-keys" % USER_ID),
        # the nodes' key reads the rule (its policy allows that), a temporary key writes it
        "GET /kvcache?lifecycle",
        "POST " + grid_path(api, "/org/users/current-user/s3-access-keys"),
        "GET /kvcache?lifecycle",
        "PUT /kvcache?lifecycle",
        "GET /kvcache?lifecycle",
        "DELETE " + grid_path(api, "/org/users/current-user/s3-access-keys/SGKEY000000000000002"),
    ]


@pytest.mark.parametrize("release, upgraded, api", [
    ("11.7.0", False, 3),
    ("11.8.0", False, 4),
    ("11.8.0", True, 4),
], ids=["11.7-fresh", "11.8-fresh", "11.8-upgraded"])
def test_first_run_creates_bucket_one_key_and_the_rule(tls_dir, run_playbook, tmp_path, release, upgraded, api):
    """The newest API version the grid enables, and a lifecycle rule StorageGRID takes.

    Failed on the old role: it called /api/v3 only (a fresh 11.8 grid enables v4 alone) and put
    AbortIncompleteMultipartUpload into the rule (StorageGRID documents no such element).
    """
    grid = StorageGridDouble(tls_dir, password=TENANT_PASSWORD, version=release, upgraded=upgraded).start()
    try:
        result = run_playbook("storagegrid_s3", role_vars(grid, tmp_path))
        assert result.returncode == 0, result.stdout[-4000:]
        assert mgmt_calls(grid) == first_run(api), mgmt_calls(grid)
        login, bucket, key = [grid.server.requests[i] for i in (1, 7, 9)]
        assert login["body"] == {"accountId": grid.account_id, "username": grid.username,
                                 "password": TENANT_PASSWORD, "cookie": False, "csrfToken": False}
        assert bucket["body"] == {"name": "kvcache", "region": "us-east-1"}
        assert key["body"] == {"expires": None}
        assert all(r["user"] == ["Bearer", TOKEN] for r in grid.server.requests[2:7])

        rule = ET.fromstring(grid.lifecycle["kvcache"])
        ns = {"s3": "http://s3.amazonaws.com/doc/2006-03-01/"}
        assert rule.find("s3:Rule/s3:ID", ns).text == "kvcache-expiration"
        assert rule.find("s3:Rule/s3:Status", ns).text == "Enabled"
        assert rule.find("s3:Rule/s3:Expiration/s3:Days", ns).text == "3"
        assert [child.tag.split("}")[1] for child in rule.find("s3:Rule", ns)] == ["ID", "Status", "Filter", "Expiration"]
        # The nodes' key (just created) reads the rule; a temporary key of the management user
        # writes it, and is gone after the run.
        access_key = list(grid.keys)[0]
        assert "Credential=%s/" % access_key in grid.server.requests[10]["user"][1]
        assert "Credential=SGKEY000000000000002/" in grid.server.requests[13]["user"][1]
        assert list(grid.keys) == [access_key] and grid.keys[access_key]["owner"] == USER_ID
        check_least_privilege(grid)
        check_the_nodes_key_cannot_change_the_bucket(grid, access_key)
    finally:
        grid.stop()
    check_key_file_and_output(grid, tmp_path, result, access_key)


DATA_POLICY = {"Statement": [
    {"Sid": "KvcacheObjects", "Effect": "Allow",
     "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                "s3:ListMultipartUploadParts"],
     "Resource": ["urn:sgws:s3:::kvcache/*"]},
    {"Sid": "KvcacheBucket", "Effect": "Allow",
     "Action": ["s3:ListBucket", "s3:ListBucketMultipartUploads", "s3:GetLifecycleConfiguration"],
     "Resource": ["urn:sgws:s3:::kvcache"]},
]}


def check_least_privilege(grid):
    """The key user is in the data group alone, whose policy is the bucket's object operations."""
    group = next(g for g in grid.groups.values() if g["uniqueName"] == "group/kvcache-data-kvcache")
    assert group["policies"] == {"management": {}, "s3": DATA_POLICY}
    assert grid.users["user/kvcache"]["memberOf"] == [group["id"]]
    for action, resource, allowed in [
            ("s3:PutObject", "urn:sgws:s3:::kvcache/chunk", True),
            ("s3:GetObject", "urn:sgws:s3:::kvcache/chunk", True),
            ("s3:GetLifecycleConfiguration", "urn:sgws:s3:::kvcache", True),
            ("s3:PutLifecycleConfiguration", "urn:sgws:s3:::kvcache", False),
            ("s3:CreateBucket", "urn:sgws:s3:::other", False),
            ("s3:DeleteBucket", "urn:sgws:s3:::kvcache", False),
            ("s3:PutBucketPolicy", "urn:sgws:s3:::kvcache", False),
            ("s3:GetObject", "urn:sgws:s3:::other/chunk", False)]:
        assert grid.allowed(USER_ID, action, resource) is allowed, (action, resource)


def check_key_file_and_output(grid, tmp_path, result, access_key):
    key_file = tmp_path / "kvcache-s3-key.json"
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    assert json.loads(key_file.read_text())["access_key"] == access_key
    assert "Move it into vault" in flat(result.stdout)
    assert secrets_in(result.stdout + result.stderr, grid) == []


def test_rerun_reuses_the_key_file_and_changes_nothing(grid, run_playbook, tmp_path):
    assert run_playbook("storagegrid_s3", role_vars(grid, tmp_path)).returncode == 0
    access_key = list(grid.keys)[0]
    grid.server.clear()
    result = run_playbook("storagegrid_s3", role_vars(grid, tmp_path))
    assert result.returncode == 0, result.stdout[-4000:]
    assert mgmt_calls(grid) == [
        "GET /api/versions",
        "POST /api/v4/authorize",
        "GET /api/v4/org/users/user/kvcache",
        "GET /api/v4/org/groups/group/kvcache-data-kvcache",
        "GET /api/v4/org/containers",
        "GET /api/v4/org/containers/kvcache/versioning",
        "GET /api/v4/org/users/%s/s3-access-keys/%s" % (USER_ID, access_key),
        "GET /kvcache?lifecycle",
    ]
    # one key for the nodes, one temporary key of the first run (deleted): none made now
    assert grid.created_keys == 2 and list(grid.keys) == [access_key]
    assert recap(result.stdout)["changed"] == 0
    assert secrets_in(result.stdout + result.stderr, grid) == []


def test_key_from_vault_is_checked_never_recreated(grid, run_playbook, tmp_path):
    assert run_playbook("storagegrid_s3", role_vars(grid, tmp_path)).returncode == 0
    access_key, entry = list(grid.keys.items())[0]
    grid.server.clear()
    result = run_playbook("storagegrid_s3", role_vars(
        grid, tmp_path, storagegrid_s3_key_file="", storagegrid_s3_create_key=False,
        storagegrid_s3_access_key=access_key, storagegrid_s3_secret_key=entry["secret"]))
    assert result.returncode == 0, result.stdout[-4000:]
    assert "POST /api/v4/org/users/%s/s3-access-keys" % USER_ID not in grid.server.calls()
    assert grid.created_keys == 2 and list(grid.keys) == [access_key]


def test_unknown_vault_key_fails_and_creates_nothing(grid, run_playbook, tmp_path):
    result = run_playbook("storagegrid_s3", role_vars(
        grid, tmp_path, storagegrid_s3_access_key="SGKEYNOTONTHEGRID", storagegrid_s3_secret_key="not-a-real-secret-0000"))
    assert result.returncode != 0
    assert "(ending in GRID) was not found" in flat(result.stdout) and "Fix:" in flat(result.stdout)
    assert "SGKEYNOTONTHEGRID" not in result.stdout + result.stderr  # the key itself is never printed
    assert grid.created_keys == 0
    assert not any("lifecycle" in r["query"] for r in grid.server.requests)
    assert "not-a-real-secret-0000" not in result.stdout + result.stderr


def test_unknown_key_user_fails_before_creating_a_key(grid, run_playbook, tmp_path):
    result = run_playbook("storagegrid_s3", role_vars(grid, tmp_path, storagegrid_s3_key_user="user/nobody"))
    assert result.returncode != 0
    assert "user/nobody" in flat(result.stdout) and "Fix:" in flat(result.stdout)
    assert grid.server.calls() == ["GET /api/versions", "POST /api/v4/authorize", "GET /api/v4/org/users/user/nobody"]
    assert grid.created_keys == 0


def test_wrong_tenant_password_is_reported(grid, run_playbook, tmp_path):
    result = run_playbook("storagegrid_s3", role_vars(grid, tmp_path, storagegrid_s3_tenant_password="wrong-password-1"))
    assert result.returncode != 0
    assert "answered 401" in flat(result.stdout) and "storagegrid_s3_tenant_password" in flat(result.stdout)
    assert grid.server.calls() == ["GET /api/versions", "POST /api/v4/authorize"]
    assert "wrong-password-1" not in result.stdout + result.stderr


@pytest.mark.parametrize("bad, variable", [
    ({"storagegrid_s3_bucket": "KV_Cache"}, "storagegrid_s3_bucket"),
    ({"storagegrid_s3_bucket": "kv..cache"}, "storagegrid_s3_bucket"),
    ({"storagegrid_s3_bucket": "192.168.10.1"}, "storagegrid_s3_bucket"),
    ({"storagegrid_s3_endpoint": "s3.grid.example.com"}, "storagegrid_s3_endpoint"),
    ({"storagegrid_s3_tenant_password": ""}, "storagegrid_s3_tenant_password"),
    ({"storagegrid_s3_key_user": "kvcache"}, "storagegrid_s3_key_user"),
    ({"storagegrid_s3_create_key": False}, "storagegrid_s3_create_key"),
    ({"storagegrid_s3_expiration_days": 0}, "storagegrid_s3_expiration_days"),
    ({"storagegrid_s3_tenant_api_url": ""}, "kvcache_s3_access_key"),
    ({"storagegrid_s3_abort_incomplete_multipart_days": 1}, "storagegrid_s3_abort_incomplete_multipart_days"),
    # Issue #33: the tenant password in clear text; failed on the role before it (it logged in over http).
    ({"storagegrid_s3_tenant_api_url": "http://admin.grid.example.com"}, "storagegrid_s3_tenant_allow_plain_http"),
])
def test_bad_input_fails_before_any_request(grid, run_playbook, tmp_path, bad, variable):
    result = run_playbook("storagegrid_s3", role_vars(grid, tmp_path, **bad))
    assert result.returncode != 0
    assert grid.server.requests == []
    assert "Host controller" in flat(result.stdout) and variable in flat(result.stdout) and "Fix:" in flat(result.stdout)
    assert TENANT_PASSWORD not in result.stdout + result.stderr


def test_versioning_is_switched_only_when_it_differs(grid, run_playbook, tmp_path):
    assert run_playbook("storagegrid_s3", role_vars(grid, tmp_path, storagegrid_s3_bucket_versioning=True)).returncode == 0
    put = [r for r in grid.server.requests if r.call == "PUT /api/v4/org/containers/kvcache/versioning"]
    assert [r["body"] for r in put] == [{"versioningEnabled": True}]
    grid.server.clear()
    assert run_playbook("storagegrid_s3", role_vars(grid, tmp_path, storagegrid_s3_bucket_versioning=True)).returncode == 0
    assert grid.server.calls(mutating_only=True) == ["POST /api/v4/authorize"]


def test_a_grid_without_a_known_api_version_is_refused(grid, run_playbook, tmp_path):
    grid.api_versions = [5]
    result = run_playbook("storagegrid_s3", role_vars(grid, tmp_path))
    assert result.returncode != 0
    assert "lists management API versions 5; this role speaks 3 and 4" in flat(result.stdout)
    assert grid.server.calls() == ["GET /api/versions"]


def test_tls_with_the_site_ca(grid, run_playbook, tmp_path):
    """validate_certs true and the CA given: every management call (and the S3 calls) trust it.

    Failed on the old role: storagegrid_s3_ca_bundle never reached the netapp.storagegrid modules,
    so creating the bucket failed the certificate check.
    """
    result = run_playbook("storagegrid_s3", role_vars(grid, tmp_path, storagegrid_s3_validate_certs=True,
                                                      storagegrid_s3_ca_bundle=grid.server.ca_file))
    assert result.returncode == 0, result.stdout[-4000:]
    assert grid.containers and len(grid.keys) == 1 and "kvcache" in grid.lifecycle


def lifecycle_puts(grid):
    return [r for r in grid.server.requests if r["method"] == "PUT" and "lifecycle" in r["query"]]


def test_the_lifecycle_put_carries_content_md5_and_no_crc_checksum(grid, run_playbook, tmp_path):
    """Issue #34 defect 8. botocore 1.36+ sends x-amz-checksum-crc32 instead of Content-MD5 on
    PutBucketLifecycleConfiguration, also with request_checksum_calculation=when_required (the
    operation requires a checksum); StorageGRID takes flexible checksums on object operations only
    (12.1+), so it refuses the rule. s3_lifecycle sends Content-MD5 of the body, and no CRC.

    Failed on the old module (botocore 1.44.8 here): the double refused its PUT, "Missing required
    header for this request: Content-MD5", and the role failed.
    """
    result = run_playbook("storagegrid_s3", role_vars(grid, tmp_path))
    assert result.returncode == 0, result.stdout[-4000:]
    puts = lifecycle_puts(grid)
    assert len(puts) == 1, mgmt_calls(grid)
    headers = puts[0]["headers"]
    assert headers.get("content-md5") == base64.b64encode(hashlib.md5(puts[0]["raw"]).digest()).decode()
    assert not [h for h in headers if h.startswith(("x-amz-checksum-", "x-amz-sdk-checksum"))], headers
    assert "content-md5" in headers["authorization"].split("SignedHeaders=", 1)[1].split(",", 1)[0].split(";")
    assert "kvcache" in grid.lifecycle


@pytest.mark.parametrize("sender, refused", [
    ("botocore", "InvalidRequest"),
    ("module", None),
    ("bad-md5", "BadDigest"),
], ids=["botocore-default-crc32-only", "s3_lifecycle-content-md5", "content-md5-of-another-body"])
def test_the_double_takes_a_lifecycle_put_only_with_content_md5(grid, sender, refused):
    """The double as StorageGRID: a lifecycle PUT with only a CRC32 checksum (this botocore's own
    request) is refused, as is a Content-MD5 that does not match the body; the module's request is taken."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    # The module as Ansible ships it to the host: this checkout through build/collections.
    sys.path.insert(0, os.path.join(ROOT, "build", "collections"))
    from ansible_collections.kvcache.offload.plugins.modules.s3_lifecycle import content_md5_only

    grid.containers.append({"name": "kvcache"})
    # a key of the tenant's administrator (root access): allowed to change the rule
    grid.keys["SGKEYTEST"] = {"owner": ADMIN_ID, "id": "key-test", "secret": "double-secret-test"}
    client = boto3.session.Session(aws_access_key_id="SGKEYTEST", aws_secret_access_key="double-secret-test",
                                   region_name="us-east-1").client(
        "s3", endpoint_url="https://localhost:%d" % grid.server.port, verify=False,
        config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1},
                      connect_timeout=5, read_timeout=5))
    if sender == "module":
        client.meta.events.register("before-sign.s3.PutBucketLifecycleConfiguration", content_md5_only)
    elif sender == "bad-md5":
        def wrong(request, **kwargs):
            request.headers["Content-MD5"] = base64.b64encode(hashlib.md5(b"another body").digest()).decode()
        client.meta.events.register("before-sign.s3.PutBucketLifecycleConfiguration", wrong)
    rules = {"Rules": [{"ID": "r", "Status": "Enabled", "Filter": {"Prefix": ""}, "Expiration": {"Days": 1}}]}
    if refused:
        with pytest.raises(ClientError) as caught:
            client.put_bucket_lifecycle_configuration(Bucket="kvcache", LifecycleConfiguration=rules)
        assert caught.value.response["Error"]["Code"] == refused
        assert "kvcache" not in grid.lifecycle
    else:
        client.put_bucket_lifecycle_configuration(Bucket="kvcache", LifecycleConfiguration=rules)
        assert "kvcache" in grid.lifecycle


def _client(grid, access, secret):
    import boto3
    from botocore.config import Config
    return boto3.session.Session(aws_access_key_id=access, aws_secret_access_key=secret, region_name="us-east-1").client(
        "s3", endpoint_url="https://localhost:%d" % grid.server.port, verify=False,
        config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1},
                      connect_timeout=5, read_timeout=5))


def check_the_nodes_key_cannot_change_the_bucket(grid, access_key):
    """Issue #33 item 4: the nodes' key can read the rule, not change it (nor anything else of
    the bucket). The old role wrote the rule with that same key: against this double it failed
    with AccessDenied at its lifecycle PUT (the key user starts in no group, as the Tenant Manager
    creates it), which is how the first-run test was made to fail first."""
    from botocore.exceptions import ClientError

    client = _client(grid, access_key, grid.keys[access_key]["secret"])
    assert client.get_bucket_lifecycle_configuration(Bucket="kvcache")["Rules"][0]["ID"] == "kvcache-expiration"
    rules = {"Rules": [{"ID": "r", "Status": "Enabled", "Filter": {"Prefix": ""}, "Expiration": {"Days": 1}}]}
    for call in (lambda: client.put_bucket_lifecycle_configuration(Bucket="kvcache", LifecycleConfiguration=rules),
                 lambda: client.delete_bucket_lifecycle(Bucket="kvcache")):
        with pytest.raises(ClientError) as caught:
            call()
        assert caught.value.response["Error"]["Code"] == "AccessDenied"
    assert "<ID>kvcache-expiration</ID>" in grid.lifecycle["kvcache"]


def test_a_widened_group_is_set_back_and_the_key_user_kept_alone_in_it(grid, run_playbook, tmp_path):
    assert run_playbook("storagegrid_s3", role_vars(grid, tmp_path)).returncode == 0
    group = next(g for g in grid.groups.values() if g["uniqueName"] == "group/kvcache-data-kvcache")
    # someone widens the group and adds the key user to the administrators
    group["policies"] = {"management": {"manageAllContainers": True},
                         "s3": {"Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "urn:sgws:s3:::*"}]}}
    grid.users["user/kvcache"]["memberOf"].append("00000000-0000-4000-8000-0000000000a1")
    assert grid.allowed(USER_ID, "s3:DeleteBucket", "urn:sgws:s3:::kvcache")
    grid.server.clear()
    result = run_playbook("storagegrid_s3", role_vars(grid, tmp_path))
    assert result.returncode == 0, result.stdout[-4000:]
    assert grid.server.calls(mutating_only=True) == [
        "POST /api/v4/authorize", "PUT /api/v4/org/groups/%s" % group["id"], "PUT /api/v4/org/users/%s" % USER_ID]
    assert recap(result.stdout)["changed"] == 2
    check_least_privilege(grid)


def test_a_management_user_that_may_not_change_the_rule_is_named_and_its_key_deleted(grid, run_playbook, tmp_path):
    grid.groups["00000000-0000-4000-8000-0000000000a1"]["policies"]["management"] = {"manageOwnS3Credentials": True}
    result = run_playbook("storagegrid_s3", role_vars(grid, tmp_path))
    assert result.returncode != 0
    text = flat(result.stdout)
    assert "could not be set with a temporary key of kvcache-admin" in text and "Root access or Manage all buckets" in text
    assert "DELETE /api/v4/org/users/current-user/s3-access-keys/SGKEY000000000000002" in grid.server.calls()
    assert [v["owner"] for v in grid.keys.values()] == [USER_ID]
    assert secrets_in(result.stdout + result.stderr, grid) == []


def test_the_double_refuses_what_storagegrid_refuses_in_a_group(grid):
    from tests.doubles.storagegrid_rest import check_group_s3_policy

    assert check_group_s3_policy(DATA_POLICY) is None
    assert "Principal" in check_group_s3_policy(
        {"Statement": [{"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "Resource": "urn:sgws:s3:::b/*"}]})
    assert "Resource" in check_group_s3_policy(
        {"Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": "b/*"}]})
    maybe = {"Effect": "Maybe", "Action": "s3:GetObject", "Resource": "urn:sgws:s3:::b"}
    assert "Effect" in check_group_s3_policy({"Statement": [maybe]})
    assert grid.allowed(USER_ID, "s3:GetObject", "urn:sgws:s3:::kvcache/x") is False  # no group: nothing
