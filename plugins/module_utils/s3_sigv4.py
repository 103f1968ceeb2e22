# -*- coding: utf-8 -*-
# Copyright: kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""AWS Signature Version 4 for simple S3 requests, with the standard library only.

Lets modules that run on GPU nodes (where boto3 is not installed) send one signed
S3 request, e.g. to prove that a virtual-hosted bucket name answers. Tested against
botocore's signer in tests/unit.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import hmac

try:
    from urllib.parse import quote
except ImportError:  # pragma: no cover - Python 2
    from urllib import quote  # type: ignore

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def _hmac(key, msg):
    return hmac.new(key, msg.encode("utf-8"), hashlib.sha256).digest()


def canonical_query(params):
    """Sorted, RFC 3986 encoded query string from a list of (name, value) pairs."""
    pairs = sorted((quote(str(k), safe="-_.~"), quote(str(v), safe="-_.~")) for k, v in params)
    return "&".join("%s=%s" % pair for pair in pairs)


def sign(method, host, path, query, region, access_key, secret_key, amz_date, payload_hash=EMPTY_SHA256, service="s3",
         session_token=None):
    """Headers (dict) that authenticate one request.

    host is the Host header value (with the port when it is not the scheme's default),
    path the URI path (already encoded), query a list of (name, value) pairs,
    amz_date a UTC time as 'YYYYMMDDTHHMMSSZ'. A session_token (temporary credentials)
    is sent, and signed, as X-Amz-Security-Token.
    """
    date = amz_date[:8]
    headers = {
        "host": host,
        "x-amz-content-sha256": payload_hash,
        "x-amz-date": amz_date,
    }
    if session_token:
        headers["x-amz-security-token"] = session_token
    signed = sorted(headers)
    canonical_headers = "".join("%s:%s\n" % (name, headers[name].strip()) for name in signed)
    signed_headers = ";".join(signed)
    canonical_request = "\n".join([
        method.upper(),
        quote(path or "/", safe="/-_.~%"),
        canonical_query(query),
        canonical_headers,
        signed_headers,
        payload_hash,
    ])
    scope = "%s/%s/%s/aws4_request" % (date, region, service)
    string_to_sign = "\n".join([
        "AWS4-HMAC-SHA256",
        amz_date,
        scope,
        hashlib.sha256(canonical_request.encode("utf-8")).hexdigest(),
    ])
    key = _hmac(("AWS4" + secret_key).encode("utf-8"), date)
    key = _hmac(key, region)
    key = _hmac(key, service)
    key = _hmac(key, "aws4_request")
    signature = hmac.new(key, string_to_sign.encode("utf-8"), hashlib.sha256).hexdigest()
    out = {
        "Host": host,
        "X-Amz-Content-SHA256": payload_hash,
        "X-Amz-Date": amz_date,
        "Authorization": "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s"
        % (access_key, scope, signed_headers, signature),
    }
    if session_token:
        out["X-Amz-Security-Token"] = session_token
    return out
