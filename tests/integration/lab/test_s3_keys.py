"""The nodes' S3 key does the cache's object operations and nothing more (issue #33 item 4).

The lab's S3 store (SeaweedFS, StorageGRID's stand-in) holds two identities, split as the
storagegrid_s3 role splits StorageGRID's keys: the management key (build/lab/secrets/
s3-management-*, used by the storage controller only) and the nodes' key (s3-access-key /
s3-secret-key, what LMCache's servers sign with). The nodes' identity may read, write and list
the tier's bucket only, and the bucket policy storagegrid_s3 keeps (storagegrid_s3_data_principal)
denies it the bucket's management, which SeaweedFS's per-bucket Write would allow.

With the nodes' key, against the running lab: an object can be written, read, listed and
deleted; no bucket can be created; the tier's bucket cannot be deleted; its expiration rule can
be neither written nor deleted (the rule the role set is still there, read with the management
key); its policy cannot be replaced or deleted. Nothing is changed when the test passes.

Wall time: about 5 s.
"""
import json
import os
import uuid

import boto3
import botocore.config
import botocore.exceptions
import pytest

from labutil import ROOT, group_hosts

SECRETS = os.path.join(ROOT, "build", "lab", "secrets")
DENIED = ("AccessDenied", "403")


def _keys(prefix):
    return [open(os.path.join(SECRETS, "%s-%s" % (prefix, what)), encoding="utf-8").read().strip()
            for what in ("access-key", "secret-key")]


def _client(hostvars, s3_host, keys):
    return boto3.client(
        "s3", endpoint_url="http://%s:8333" % hostvars[s3_host]["ansible_host"], region_name="us-east-1",
        aws_access_key_id=keys[0], aws_secret_access_key=keys[1],
        config=botocore.config.Config(connect_timeout=5, read_timeout=20, retries={"max_attempts": 1},
                                      s3={"addressing_style": "path"}))


def _refused(call):
    """The S3 error code of a call that must be refused, or 'allowed' when it went through."""
    try:
        call()
    except botocore.exceptions.ClientError as err:
        return err.response.get("Error", {}).get("Code", "") or str(err.response["ResponseMetadata"]["HTTPStatusCode"])
    return "allowed"


@pytest.fixture(scope="module")
def clients(inventory, hostvars):
    s3_host = group_hosts(inventory, "kvcache_s3_store")[0]
    node_keys, management_keys = _keys("s3"), _keys("s3-management")
    assert node_keys[0] != management_keys[0], "the lab's nodes' key and management key are one key"
    return _client(hostvars, s3_host, node_keys), _client(hostvars, s3_host, management_keys)


@pytest.fixture(scope="module")
def bucket(hostvars):
    return hostvars["localhost"]["kvcache_s3_bucket"]


def test_the_nodes_key_does_the_caches_object_operations(clients, bucket):
    node, _management = clients
    key = "kvcache-key-test/%s.data" % uuid.uuid4().hex
    node.put_object(Bucket=bucket, Key=key, Body=b"kv")
    try:
        assert node.get_object(Bucket=bucket, Key=key)["Body"].read() == b"kv"
        listed = node.list_objects_v2(Bucket=bucket, Prefix="kvcache-key-test/")
        assert key in [o["Key"] for o in listed.get("Contents", [])]
        upload = node.create_multipart_upload(Bucket=bucket, Key=key + ".mp")["UploadId"]
        node.abort_multipart_upload(Bucket=bucket, Key=key + ".mp", UploadId=upload)
    finally:
        node.delete_object(Bucket=bucket, Key=key)
    assert _refused(lambda: node.head_object(Bucket=bucket, Key=key)) in ("404", "NoSuchKey", "NotFound")


def _policy(client, bucket):
    try:
        return json.loads(client.get_bucket_policy(Bucket=bucket)["Policy"])
    except botocore.exceptions.ClientError as err:
        if err.response.get("Error", {}).get("Code") == "NoSuchBucketPolicy":
            return None
        raise


def _rules(client, bucket):
    try:
        return client.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    except botocore.exceptions.ClientError as err:
        if err.response.get("Error", {}).get("Code") == "NoSuchLifecycleConfiguration":
            return None
        raise


def test_the_nodes_key_cannot_manage_buckets(clients, bucket):
    node, management = clients
    rule_before = _rules(management, bucket)
    assert rule_before, "the tier's bucket has no expiration rule before the test"
    policy_before = _policy(management, bucket)
    other = "kvcache-key-test-%s" % uuid.uuid4().hex[:8]
    rule = {"Rules": [{"ID": "planted", "Status": "Enabled", "Filter": {"Prefix": ""}, "Expiration": {"Days": 1}}]}
    try:
        tried = {
            "create a bucket": _refused(lambda: node.create_bucket(Bucket=other)),
            "write the expiration rule": _refused(
                lambda: node.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration=rule)),
            "delete the expiration rule": _refused(lambda: node.delete_bucket_lifecycle(Bucket=bucket)),
            "replace the bucket policy": _refused(lambda: node.put_bucket_policy(
                Bucket=bucket, Policy=json.dumps({"Version": "2012-10-17", "Statement": []}))),
            "delete the bucket policy": _refused(lambda: node.delete_bucket_policy(Bucket=bucket)),
            "switch versioning on": _refused(lambda: node.put_bucket_versioning(
                Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})),
            # last: with a key that may, this deletes the tier (SeaweedFS deletes a bucket with objects)
            "delete the tier's bucket": _refused(lambda: node.delete_bucket(Bucket=bucket)),
        }
    finally:
        # A key that was let through changed the store: set back what the role keeps.
        if _rules(management, bucket) != rule_before:
            management.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": rule_before})
        if policy_before is not None and _policy(management, bucket) != policy_before:
            management.put_bucket_policy(Bucket=bucket, Policy=json.dumps(policy_before))
        if other in [b["Name"] for b in management.list_buckets()["Buckets"]]:
            management.delete_bucket(Bucket=other)
    assert all(code in DENIED for code in tried.values()), tried
    # Refused, and nothing changed: the role's rule and policy are as they were.
    assert _rules(management, bucket) == rule_before
    assert _policy(management, bucket) == policy_before
    # The policy is the role's: it names the nodes' identity.
    assert policy_before is not None, "the tier's bucket has no policy (storagegrid_s3_data_principal)"
    principals = [st.get("Principal", {}).get("AWS") for st in policy_before["Statement"] if st.get("Effect") == "Deny"]
    assert "arn:aws:iam::*:user/kvcache" in principals, policy_before
