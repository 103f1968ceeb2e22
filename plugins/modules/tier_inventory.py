#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kvcache.offload contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: tier_inventory
short_description: Report what the shared KV-cache tier holds, per model
version_added: 0.1.0
description:
  - Lists the shared tier LMCache offloads to, either an S3 bucket (ListObjectsV2 through boto3,
    for StorageGRID or any S3 store) or a file system path (the ONTAP NFS mount), and returns the
    number of objects, their bytes and the newest write time, in total and per model.
  - Understands the object names of LMCache 0.5.6, in-process mode
    (C(<model>@<world_size>@<worker_id>@<chunk_hash>@<dtype>), C(.data) files with C(/) written as
    C(-SEP-) on fs, C(/) written as C(_) on S3) and multiprocess mode
    (C(<model>@<kv_rank>@<group>@<chunk_hash>)). Anything else is counted as unrecognized.
  - With O(baseline) (an earlier result of this module) it returns RV(delta), what was added since.
  - A listing failure is returned as a structured RV(error) (auth, not_found, addressing, dns,
    connection, timeout, tls, missing, permission, ...) and fails the task.
author:
  - kvcache.offload developers (!UNKNOWN)
requirements:
  - boto3 (Python library) for O(backend=s3).
options:
  backend:
    description:
      - Kind of shared tier.
    type: str
    required: true
    choices: [s3, fs]
  path:
    description:
      - Directory of the fs tier (LMCache C(base_path)). Required with O(backend=fs).
    type: path
  bucket:
    description:
      - Bucket name. Required with O(backend=s3).
    type: str
  prefix:
    description:
      - Only list keys starting with this prefix.
    type: str
    default: ""
  retries:
    description:
      - Attempts per S3 request (botocore standard retry mode), including the first.
    type: int
    default: 2
  max_objects:
    description:
      - Stop after this many objects and set RV(truncated). A tier without eviction can grow large.
    type: int
    default: 200000
  models:
    description:
      - Model strings (as given to vLLM) to report even when they have no object, matched in every
        spelling LMCache uses (C(/) kept, C(-SEP-), C(_)).
    type: list
    elements: str
    default: []
  baseline:
    description:
      - An earlier registered result of this module; RV(delta) says what was added since.
    type: dict
notes:
  - Read-only; runs in check mode as well.
  - With O(backend=s3), omit O(endpoint_url) for AWS; without O(access_key) and O(secret_key) boto3's default
    credential chain is used. O(addressing_style) does not matter for a listing (LMCache itself only uses
    virtual-hosted names).
extends_documentation_fragment:
  - kvcache.offload.s3_client
  - kvcache.offload.s3_client.addressing_style
  - kvcache.offload.read_only
"""

EXAMPLES = r"""
- name: What the StorageGRID bucket holds
  kvcache.offload.tier_inventory:
    backend: s3
    endpoint_url: "https://s3.grid.example:10443"
    bucket: kvcache
    access_key: "{{ kvcache_s3_access_key }}"
    secret_key: "{{ kvcache_s3_secret_key }}"
    ca_path: /etc/ssl/certs/ca-certificates.crt
    models: ["{{ kvcache_model }}"]
  delegate_to: localhost
  register: tier_before

- name: What the shared NFS volume holds, and what the probe added
  kvcache.offload.tier_inventory:
    backend: fs
    path: /mnt/kvcache
    models: ["{{ kvcache_model }}"]
    baseline: "{{ tier_before_fs }}"
  register: tier_after
"""

RETURN = r"""
backend:
  description: The backend listed.
  returned: always
  type: str
  sample: s3
location:
  description: C(s3://bucket/prefix) with the endpoint, or the fs path.
  returned: always
  type: str
objects:
  description: Number of objects (in-flight C(.tmp) files not counted).
  returned: success
  type: int
bytes:
  description: Total bytes of those objects.
  returned: success
  type: int
newest_epoch:
  description: Modification time of the newest object, epoch seconds.
  returned: success
  type: float
newest:
  description: The same as ISO 8601 UTC.
  returned: success
  type: str
oldest_epoch:
  description: Modification time of the oldest object, epoch seconds.
  returned: success
  type: float
oldest:
  description: The same as ISO 8601 UTC.
  returned: success
  type: str
models:
  description:
    - Per model string, C(objects), C(bytes), C(newest_epoch), C(newest), C(formats) (inprocess, mp),
      C(world_sizes), C(dtypes), C(workers).
    - On S3 in in-process mode the model's C(/) are stored as C(_); names given in O(models) are mapped back.
  returned: success
  type: dict
unrecognized:
  description: Objects whose name is not an LMCache key (C(objects), C(bytes), C(examples)).
  returned: success
  type: dict
in_flight:
  description: Temporary C(.tmp) files of writes in progress (C(objects), C(bytes)).
  returned: success
  type: dict
truncated:
  description: The listing stopped at O(max_objects).
  returned: success
  type: bool
pages:
  description: ListObjectsV2 pages read (S3 only).
  returned: success
  type: int
walk_errors:
  description: Entries the fs walk could not read.
  returned: success
  type: list
  elements: str
fs:
  description: Facts about the fs path, C(exists), C(is_dir), C(is_mount), C(read_only), C(writable), C(total_bytes), C(free_bytes).
  returned: when backend is fs
  type: dict
delta:
  description: C(objects), C(bytes), C(newer_than_baseline) and per-model C(objects) and C(bytes) added since O(baseline).
  returned: when baseline is given
  type: dict
error:
  description: Null, or C(kind), C(message), C(code) (S3 error code) and C(http_status).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.kvcache.offload.plugins.module_utils.shared_args import addressing_style_spec, s3_argument_spec
from ansible_collections.kvcache.offload.plugins.module_utils.tier import (
    BOTO3_IMPORT_ERROR,
    HAS_BOTO3,
    Inventory,
    TierError,
    fs_state,
    inventory_delta,
    list_s3,
    make_s3_client,
    walk_fs,
)


def argument_spec():
    spec = dict(
        backend=dict(type="str", required=True, choices=["s3", "fs"]),
        path=dict(type="path"),
        bucket=dict(type="str"),
        prefix=dict(type="str", default=""),
        retries=dict(type="int", default=2),
        max_objects=dict(type="int", default=200000),
        models=dict(type="list", elements="str", default=[]),
        baseline=dict(type="dict"),
    )
    # endpoint_url, region, keys, timeout, validate_certs, ca_path: the collection's S3 contract.
    spec.update(s3_argument_spec())
    spec.update(addressing_style_spec())
    return spec


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(),
        required_if=[("backend", "fs", ("path",)), ("backend", "s3", ("bucket",))],
        required_together=[("access_key", "secret_key")],
        supports_check_mode=True,
    )
    p = module.params
    if p["timeout"] <= 0:
        module.fail_json(msg="timeout must be positive")
    if p["retries"] < 1 or p["max_objects"] < 1:
        module.fail_json(msg="retries and max_objects must be at least 1")

    inventory = Inventory(models=p["models"])
    result = dict(changed=False, backend=p["backend"], error=None)
    try:
        if p["backend"] == "fs":
            result["location"] = p["path"]
            result["fs"] = fs_state(p["path"])
            truncated, errors = walk_fs(p["path"], inventory, max_objects=p["max_objects"])
            result["walk_errors"] = errors[:50]
            result["pages"] = 0
        else:
            if not HAS_BOTO3:
                module.fail_json(msg=missing_required_lib("boto3"), exception=str(BOTO3_IMPORT_ERROR))
            where = p["endpoint_url"] or "aws"
            result["location"] = "s3://%s/%s (%s)" % (p["bucket"], p["prefix"], where)
            client = make_s3_client(
                endpoint_url=p["endpoint_url"], region=p["region"], access_key=p["access_key"], secret_key=p["secret_key"],
                session_token=p["session_token"], addressing_style=p["addressing_style"], validate_certs=p["validate_certs"],
                ca_path=p["ca_path"], connect_timeout=p["timeout"], read_timeout=p["timeout"], retries=p["retries"],
            )
            truncated, pages = list_s3(client, p["bucket"], inventory, prefix=p["prefix"], max_objects=p["max_objects"])
            result["pages"] = pages
            result["walk_errors"] = []
    except TierError as exc:
        result["error"] = exc.to_dict()
        module.fail_json(msg="cannot list the shared tier %s: %s: %s" % (result.get("location"), exc.kind, exc.message), **result)

    result.update(inventory.result())
    result["truncated"] = truncated
    if p["baseline"] is not None:
        result["delta"] = inventory_delta(result, p["baseline"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
