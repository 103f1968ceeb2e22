#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: s3_vhost_probe
short_description: Prove that a bucket answers under its virtual-hosted name from this host
version_added: 0.1.0
description:
  - LMCache's S3 connector reaches a bucket only as C(<bucket>.<endpoint host>) (virtual-hosted style).
    This module, run on each GPU node, resolves that name, sends one signed C(ListObjectsV2) request
    (C(max-keys=1)) to it, and checks that the answer is a listing of that bucket.
  - Fails with a message that says what to fix, telling apart a name that does not resolve, an endpoint
    that does not answer, an endpoint that ignores the bucket in the host name (no endpoint domain configured,
    so it answers as path style), wrong keys, and a missing bucket.
  - Uses only the Python standard library (SigV4 signing in C(module_utils/s3_sigv4)); reads only.
author:
  - kvcache.offload contributors (@kvcache-offload)
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
extends_documentation_fragment:
  - kvcache.offload.s3_client
  - kvcache.offload.read_only
"""

EXAMPLES = r"""
- name: Check that every node reaches the bucket by its virtual-hosted name
  kvcache.offload.s3_vhost_probe:
    endpoint_url: https://s3.grid.example.com
    bucket: kvcache
    access_key: "{{ kvcache_s3_access_key }}"
    secret_key: "{{ kvcache_s3_secret_key }}"
  no_log: true
"""

RETURN = r"""
url:
  description: URL that was probed.
  returned: always
  type: str
  sample: https://kvcache.s3.grid.example.com/?list-type=2&max-keys=1
host:
  description: Virtual-hosted name.
  returned: always
  type: str
  sample: kvcache.s3.grid.example.com
addresses:
  description: Addresses the name resolved to on this host.
  returned: always
  type: list
  elements: str
  sample: ["10.20.0.40"]
status:
  description: HTTP status of the signed request (0 when there was no answer).
  returned: always
  type: int
  sample: 200
reachable:
  description: Whether the bucket answered under its virtual-hosted name (false when the module fails).
  returned: always
  type: bool
  sample: true
"""

import time
import socket
import ssl
import xml.etree.ElementTree as ET

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.six.moves.urllib.parse import urlsplit
from ansible.module_utils.six.moves import http_client
from ansible_collections.kvcache.offload.plugins.module_utils import s3_sigv4
from ansible_collections.kvcache.offload.plugins.module_utils.http_client import build_ssl_context
from ansible_collections.kvcache.offload.plugins.module_utils.shared_args import s3_argument_spec


def _local(tag):
    return tag.rsplit("}", 1)[-1]


def argument_spec():
    spec = dict(bucket=dict(type="str", required=True))
    # endpoint_url, region, keys, timeout, validate_certs, ca_path: the collection's S3 contract.
    spec.update(s3_argument_spec(required=True))
    return spec


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    p = module.params
    parts = urlsplit(p["endpoint_url"])
    if parts.scheme not in ("http", "https") or not parts.hostname:
        module.fail_json(msg="endpoint_url %r has no http:// or https:// scheme. Fix: give the full URL, e.g. https://s3.example.com"
                         % p["endpoint_url"], url="", host="", addresses=[], status=0, reachable=False)
    if p["timeout"] <= 0:
        module.fail_json(msg="timeout must be positive", url="", host="", addresses=[], status=0, reachable=False)
    default_port = 443 if parts.scheme == "https" else 80
    port = parts.port or default_port
    host = "%s.%s" % (p["bucket"], parts.hostname)
    host_header = host if port == default_port else "%s:%d" % (host, port)
    query = [("list-type", "2"), ("max-keys", "1")]
    url = "%s://%s/?%s" % (parts.scheme, host_header, s3_sigv4.canonical_query(query))
    result = dict(changed=False, url=url, host=host, addresses=[], status=0, reachable=False)

    try:
        infos = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
    except socket.gaierror as exc:
        module.fail_json(
            msg="%s does not resolve on this host (%s). LMCache reaches S3 only by virtual-hosted names. "
                "Fix: add a wildcard DNS record *.%s (or a hosts entry for %s) pointing at the S3 endpoint, "
                "and configure %s as an endpoint domain name on the S3 service (StorageGRID: Configuration > "
                "Network > S3 endpoint domain names)." % (host, exc, parts.hostname, host, parts.hostname),
            **result)
    result["addresses"] = sorted(set(info[4][0] for info in infos))

    amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    headers = s3_sigv4.sign("GET", host_header, "/", query, p["region"], p["access_key"], p["secret_key"], amz_date,
                            session_token=p["session_token"])
    if parts.scheme == "https":
        # The collection's one TLS setup (module_utils/http_client.py), as for every HTTP module.
        context = build_ssl_context(p["validate_certs"], p["ca_path"])
        conn = http_client.HTTPSConnection(host, port, timeout=p["timeout"], context=context)
    else:
        conn = http_client.HTTPConnection(host, port, timeout=p["timeout"])
    try:
        conn.request("GET", "/?" + s3_sigv4.canonical_query(query), headers=headers)
        response = conn.getresponse()
        body = response.read(65536)
        result["status"] = response.status
    except ssl.SSLError as exc:
        module.fail_json(msg="TLS to %s failed: %s. Fix: the endpoint certificate must cover *.%s (a wildcard SAN), "
                         "and the node must trust its CA." % (host, exc, parts.hostname), **result)
    except (socket.error, socket.timeout, http_client.HTTPException) as exc:
        module.fail_json(msg="%s resolves to %s but does not answer on port %d within %gs: %s. Fix: check that the "
                         "name points at the S3 endpoint (load balancer or gateway node) and that port %d is open "
                         "from this node." % (host, ", ".join(result["addresses"]), port, p["timeout"], exc, port),
                         **result)
    finally:
        conn.close()

    try:
        root = ET.fromstring(body) if body else None
    except ET.ParseError:
        root = None
    tag = _local(root.tag) if root is not None else ""
    code = ""
    name = ""
    if root is not None:
        for child in root:
            if _local(child.tag) == "Code":
                code = child.text or ""
            if _local(child.tag) == "Name":
                name = child.text or ""

    if result["status"] == 200 and tag == "ListBucketResult" and name == p["bucket"]:
        result["reachable"] = True
        module.exit_json(**result)
    if result["status"] == 200 and tag == "ListAllMyBucketsResult":
        module.fail_json(msg="%s answered as the service root (a bucket list), not as bucket %s: the S3 service does not "
                         "know %s as an endpoint domain. Fix: add %s to the endpoint domain names (StorageGRID) or "
                         "-s3.domainName (the lab store)." % (host, p["bucket"], parts.hostname, parts.hostname), **result)
    if result["status"] == 403 or code in ("AccessDenied", "SignatureDoesNotMatch", "InvalidAccessKeyId"):
        module.fail_json(msg="%s refused the signed request (%s %s). Fix: check kvcache_s3_access_key / "
                         "kvcache_s3_secret_key and the region, and that the key's user may list the bucket."
                         % (host, result["status"], code), **result)
    if code == "NoSuchBucket" or result["status"] == 404:
        module.fail_json(msg="Bucket %s does not exist on %s (%s %s). Fix: run the storage playbook, or check "
                         "kvcache_s3_bucket." % (p["bucket"], host, result["status"], code), **result)
    module.fail_json(msg="%s answered %s %s (%s), not a listing of bucket %s. Fix: check that the name points at the "
                     "S3 endpoint." % (host, result["status"], code, tag, p["bucket"]), **result)


if __name__ == "__main__":
    main()
