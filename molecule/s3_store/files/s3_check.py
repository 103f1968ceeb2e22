"""Read the lab store back with boto3 (run by verify.yml on the instance).

Keys come from the environment (S3_ACCESS_KEY, S3_SECRET_KEY: the nodes' key), never the command
line. Prints one JSON object: what the store really holds, how it answers wrong keys, and what
the nodes' key may not do to the bucket (each call's HTTP status; 200 would be a change).
"""
import json
import os
import sys
import urllib.error
import urllib.request

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

endpoint, bucket, region = sys.argv[1], sys.argv[2], sys.argv[3]
cfg = Config(connect_timeout=5, read_timeout=10, retries={"max_attempts": 1}, s3={"addressing_style": "path"})


def client(access, secret):
    return boto3.client("s3", endpoint_url=endpoint, region_name=region, aws_access_key_id=access,
                        aws_secret_access_key=secret, config=cfg)


def status_of(call):
    try:
        call()
        return 200
    except ClientError as exc:
        return int(exc.response["ResponseMetadata"]["HTTPStatusCode"])


good = client(os.environ["S3_ACCESS_KEY"], os.environ["S3_SECRET_KEY"])
out = {}
out["buckets"] = [b["Name"] for b in good.list_buckets()["Buckets"]]
out["rules"] = good.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
good.put_object(Bucket=bucket, Key="verify/probe", Body=b"kv-chunk")
out["read_back"] = good.get_object(Bucket=bucket, Key="verify/probe")["Body"].read().decode()
wrong = client(os.environ["S3_ACCESS_KEY"], "not-the-secret-key-000")
out["wrong_secret_status"] = status_of(lambda: wrong.list_objects_v2(Bucket=bucket))
unknown = client("NOSUCHKEY0000000", "not-the-secret-key-000")
out["unknown_key_status"] = status_of(lambda: unknown.get_object(Bucket=bucket, Key="verify/probe"))
rule = {"Rules": [{"ID": "planted", "Status": "Enabled", "Filter": {"Prefix": ""}, "Expiration": {"Days": 1}}]}
out["node_key_management"] = {
    "create_bucket": status_of(lambda: good.create_bucket(Bucket=bucket + "-planted")),
    "delete_bucket": status_of(lambda: good.delete_bucket(Bucket=bucket)),
    "put_lifecycle": status_of(lambda: good.put_bucket_lifecycle_configuration(Bucket=bucket,
                                                                               LifecycleConfiguration=rule)),
    "delete_lifecycle": status_of(lambda: good.delete_bucket_lifecycle(Bucket=bucket)),
    "delete_policy": status_of(lambda: good.delete_bucket_policy(Bucket=bucket)),
}
out["rules_after"] = good.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
try:
    with urllib.request.urlopen("%s/%s/verify/probe" % (endpoint, bucket), timeout=5) as resp:
        out["anonymous_status"] = resp.status
except urllib.error.HTTPError as exc:
    out["anonymous_status"] = exc.code
print(json.dumps(out, default=str))
