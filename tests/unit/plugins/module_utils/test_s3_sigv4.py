"""module_utils/s3_sigv4 signs exactly like botocore (the reference SigV4 implementation)."""
import datetime

import pytest

botocore = pytest.importorskip("botocore")
from botocore.auth import S3SigV4Auth  # noqa: E402
from botocore.awsrequest import AWSRequest  # noqa: E402
from botocore.credentials import Credentials  # noqa: E402

from ansible_collections.kvcache.offload.plugins.module_utils import s3_sigv4  # noqa: E402


@pytest.mark.parametrize("host, query", [
    ("kvcache.s3.lab.internal:8333", [("list-type", "2"), ("max-keys", "1")]),
    ("kvcache.s3.grid.example.com", [("prefix", "model@1@0/a b"), ("list-type", "2")]),
])
def test_signature_matches_botocore(monkeypatch, host, query):
    amz_date = "20260102T030405Z"
    ours = s3_sigv4.sign("GET", host, "/", query, "us-east-1", "AKIDEXAMPLE", "secret/key+example", amz_date)

    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: datetime.datetime(2026, 1, 2, 3, 4, 5))
    url = "http://%s/?%s" % (host, s3_sigv4.canonical_query(query))
    request = AWSRequest(method="GET", url=url, headers={"X-Amz-Content-SHA256": s3_sigv4.EMPTY_SHA256})
    S3SigV4Auth(Credentials("AKIDEXAMPLE", "secret/key+example"), "s3", "us-east-1").add_auth(request)
    assert ours["X-Amz-Date"] == request.headers["X-Amz-Date"]
    assert ours["Authorization"] == request.headers["Authorization"]


def test_session_token_is_sent_and_signed_like_botocore(monkeypatch):
    host, query, amz_date = "kvcache.s3.lab.internal:8333", [("list-type", "2")], "20260102T030405Z"
    ours = s3_sigv4.sign("GET", host, "/", query, "us-east-1", "ASIAEXAMPLE", "secret", amz_date, session_token="tok/en+1")

    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: datetime.datetime(2026, 1, 2, 3, 4, 5))
    url = "http://%s/?%s" % (host, s3_sigv4.canonical_query(query))
    request = AWSRequest(method="GET", url=url, headers={"X-Amz-Content-SHA256": s3_sigv4.EMPTY_SHA256})
    S3SigV4Auth(Credentials("ASIAEXAMPLE", "secret", "tok/en+1"), "s3", "us-east-1").add_auth(request)
    assert ours["X-Amz-Security-Token"] == request.headers["X-Amz-Security-Token"] == "tok/en+1"
    assert ours["Authorization"] == request.headers["Authorization"]
    assert "x-amz-security-token" in ours["Authorization"]


def test_canonical_query_sorts_and_encodes():
    assert s3_sigv4.canonical_query([("b", "x y"), ("a", "1/2")]) == "a=1%2F2&b=x%20y"
