#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: s3_lifecycle
short_description: One expiration rule on an S3 bucket (StorageGRID, any S3 store)
version_added: 0.1.0
description:
  - Keeps one lifecycle rule, identified by O(rule_id), on a bucket through the S3 API
    (C(GetBucketLifecycleConfiguration) / C(PutBucketLifecycleConfiguration)), so a KV-cache tier
    without eviction cannot grow without bound. Objects expire O(expiration_days) after they were written.
  - Other rules on the bucket are kept as they are. Idempotent, nothing is written when the rule is already there.
  - Written for StorageGRID (which supports Expiration rules with a prefix filter, counted from ingest time)
    and tested against a real S3 store (SeaweedFS).
  - The C(PutBucketLifecycleConfiguration) request carries C(Content-MD5) and no flexible checksum, whatever the
    botocore release. botocore 1.36 and later send C(x-amz-checksum-crc32) instead of C(Content-MD5) on it, even
    with C(request_checksum_calculation=when_required) (the operation requires a checksum), and StorageGRID
    takes flexible checksums on object operations only (from 12.1), not on bucket configuration.
author:
  - kvcache.offload contributors (@kvcache-offload)
attributes:
  check_mode:
    support: full
    description: Reads only in check mode and reports what it would change.
  diff_mode:
    support: none
    description: No diff is returned.
options:
  bucket:
    description: Bucket name.
    type: str
    required: true
  endpoint_url:
    required: true
  access_key:
    required: true
  secret_key:
    required: true
  timeout:
    default: 30.0
  addressing_style:
    default: path
  rule_id:
    description: ID of the rule this module owns.
    type: str
    default: kvcache-expiration
  prefix:
    description: Object key prefix the rule applies to; empty for every object.
    type: str
    default: ""
  expiration_days:
    description: Days after which an object expires.
    type: int
  abort_incomplete_multipart_days:
    description: Days after which incomplete multipart uploads are aborted; C(0) leaves it out of the rule.
    type: int
    default: 0
  state:
    description: Whether the rule is there or not.
    type: str
    choices: [present, absent]
    default: present
requirements:
  - boto3
extends_documentation_fragment:
  - kvcache.offload.s3_client
  - kvcache.offload.s3_client.addressing_style
"""

EXAMPLES = r"""
- name: Expire KV-cache objects one week after they were written
  kvcache.offload.s3_lifecycle:
    bucket: kvcache
    endpoint_url: https://s3.grid.example.com
    access_key: "{{ kvcache_s3_access_key }}"
    secret_key: "{{ kvcache_s3_secret_key }}"
    expiration_days: 7
  no_log: true
"""

RETURN = r"""
rule:
  description: The rule as the module wants it (absent when O(state=absent)).
  returned: always
  type: dict
  sample: {"ID": "kvcache-expiration", "Status": "Enabled", "Filter": {"Prefix": ""}, "Expiration": {"Days": 7}}
rules:
  description: Every lifecycle rule on the bucket after the run (as read back, or as it would be in check mode).
  returned: always
  type: list
  elements: dict
"""

import base64
import hashlib
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.kvcache.offload.plugins.module_utils.shared_args import addressing_style_spec, s3_argument_spec
from ansible_collections.kvcache.offload.plugins.module_utils.tier import make_s3_client

try:
    from botocore.exceptions import BotoCoreError, ClientError
    HAS_BOTO3 = True
    BOTO3_IMPORT_ERROR = None
except ImportError:
    HAS_BOTO3 = False
    BOTO3_IMPORT_ERROR = traceback.format_exc()


# Flexible-checksum headers botocore 1.36+ adds to an operation that requires a checksum.
_FLEXIBLE_CHECKSUM_HEADERS = ("x-amz-checksum-", "x-amz-sdk-checksum-algorithm", "x-amz-trailer")


def content_md5_only(request, **kwargs):
    """botocore before-sign handler: the request carries Content-MD5 of its body and no flexible checksum.

    botocore 1.36+ replaced Content-MD5 with x-amz-checksum-crc32 on PutBucketLifecycleConfiguration
    (request_checksum_calculation=when_required does not change that: the operation requires a
    checksum, and the default algorithm is CRC32). S3 stores that predate flexible checksums on bucket
    operations (StorageGRID: object operations only, from 12.1) refuse the request without Content-MD5.
    Runs before signing, so the signature covers the header it sets.
    """
    for name in list(request.headers.keys()):
        if name.lower().startswith(_FLEXIBLE_CHECKSUM_HEADERS):
            del request.headers[name]
    if "Content-MD5" not in request.headers:
        body = request.body or b""
        if hasattr(body, "read"):
            position = body.tell()
            data = body.read()
            body.seek(position)
            body = data
        if not isinstance(body, bytes):
            body = body.encode("utf-8")
        try:
            digest = hashlib.md5(body, usedforsecurity=False).digest()
        except TypeError:  # Python < 3.9
            digest = hashlib.md5(body).digest()  # nosec - S3's integrity header, not security
        request.headers["Content-MD5"] = base64.b64encode(digest).decode("ascii")


def _prefix(rule):
    flt = rule.get("Filter")
    if isinstance(flt, dict):
        if "Prefix" in flt:
            return flt.get("Prefix") or ""
        if isinstance(flt.get("And"), dict):
            return flt["And"].get("Prefix") or ""
        return ""
    return rule.get("Prefix") or ""


def normalize(rule):
    """The parts of a rule this module manages, comparable across S3 implementations."""
    abort = rule.get("AbortIncompleteMultipartUpload") or {}
    return {
        "ID": rule.get("ID"),
        "Status": rule.get("Status"),
        "Prefix": _prefix(rule),
        "Days": (rule.get("Expiration") or {}).get("Days"),
        "AbortDays": abort.get("DaysAfterInitiation"),
    }


def wanted_rule(params):
    rule = {
        "ID": params["rule_id"],
        "Status": "Enabled",
        "Filter": {"Prefix": params["prefix"]},
        "Expiration": {"Days": params["expiration_days"]},
    }
    if params["abort_incomplete_multipart_days"]:
        rule["AbortIncompleteMultipartUpload"] = {"DaysAfterInitiation": params["abort_incomplete_multipart_days"]}
    return rule


def argument_spec():
    spec = dict(
        bucket=dict(type="str", required=True),
        rule_id=dict(type="str", default="kvcache-expiration"),
        prefix=dict(type="str", default=""),
        expiration_days=dict(type="int"),
        abort_incomplete_multipart_days=dict(type="int", default=0),
        state=dict(type="str", default="present", choices=["present", "absent"]),
    )
    # endpoint_url, region, keys, timeout, validate_certs, ca_path: the collection's S3 contract.
    spec.update(s3_argument_spec(timeout=30.0, required=True))
    spec.update(addressing_style_spec(default="path"))
    return spec


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(),
        required_if=[("state", "present", ["expiration_days"])],
        supports_check_mode=True,
    )
    if not HAS_BOTO3:
        module.fail_json(msg=missing_required_lib("boto3"), exception=BOTO3_IMPORT_ERROR)
    p = module.params
    if not p["endpoint_url"].startswith(("http://", "https://")):
        module.fail_json(msg="endpoint_url %r has no http:// or https:// scheme." % p["endpoint_url"], rule={}, rules=[])
    if p["state"] == "present" and p["expiration_days"] < 1:
        module.fail_json(msg="expiration_days must be at least 1, got %d." % p["expiration_days"], rule={}, rules=[])

    # The collection's one S3 client (module_utils/tier.py): explicit timeouts, bounded retries.
    client = make_s3_client(
        endpoint_url=p["endpoint_url"], region=p["region"], access_key=p["access_key"], secret_key=p["secret_key"],
        session_token=p["session_token"], addressing_style=p["addressing_style"], validate_certs=p["validate_certs"],
        ca_path=p["ca_path"], connect_timeout=p["timeout"], read_timeout=p["timeout"], retries=3)
    client.meta.events.register("before-sign.s3.PutBucketLifecycleConfiguration", content_md5_only)

    try:
        try:
            current = client.get_bucket_lifecycle_configuration(Bucket=p["bucket"]).get("Rules", [])
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "NoSuchLifecycleConfiguration":
                current = []
            else:
                raise
        others = [r for r in current if r.get("ID") != p["rule_id"]]
        mine = [r for r in current if r.get("ID") == p["rule_id"]]
        rule = wanted_rule(p) if p["state"] == "present" else {}

        if p["state"] == "present":
            changed = len(mine) != 1 or normalize(mine[0]) != normalize(rule)
            new_rules = others + [rule]
        else:
            changed = bool(mine)
            new_rules = others

        if changed and not module.check_mode:
            if new_rules:
                client.put_bucket_lifecycle_configuration(
                    Bucket=p["bucket"], LifecycleConfiguration={"Rules": new_rules})
            else:
                client.delete_bucket_lifecycle(Bucket=p["bucket"])
            try:
                new_rules = client.get_bucket_lifecycle_configuration(Bucket=p["bucket"]).get("Rules", [])
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "NoSuchLifecycleConfiguration":
                    raise
                new_rules = []
            if p["state"] == "present":
                back = [r for r in new_rules if r.get("ID") == p["rule_id"]]
                if len(back) != 1 or normalize(back[0]) != normalize(rule):
                    module.fail_json(msg="The store accepted the lifecycle rule but reads back %r." % back,
                                     rule=rule, rules=new_rules)
    except ClientError as exc:
        err = exc.response.get("Error", {})
        module.fail_json(msg="S3 %s on bucket %s failed: %s %s" % (exc.operation_name, p["bucket"], err.get("Code"), err.get("Message")),
                         rule={}, rules=[])
    except BotoCoreError as exc:
        module.fail_json(msg="S3 request to %s failed: %s" % (p["endpoint_url"], exc), rule={}, rules=[])

    module.exit_json(changed=changed, rule=rule, rules=new_rules)


if __name__ == "__main__":
    main()
