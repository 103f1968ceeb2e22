from __future__ import annotations

import io
import time

import pytest

from ansible_collections.kvcache.offload.plugins.module_utils import http_client as http


def test_fetch_returns_body_and_status(static_pages):
    static_pages.pages["/metrics"] = (200, b"vllm:x 1\n")
    status, headers, body, elapsed = http.fetch(static_pages.base_url + "/metrics", timeout=2)
    assert status == 200
    assert body == b"vllm:x 1\n"
    assert headers["content-type"].startswith("text/plain")
    assert 0 <= elapsed < 2
    assert static_pages.requests[0]["path"] == "/metrics"


def test_fetch_sends_bearer_and_user_agent(static_pages):
    static_pages.pages["/m"] = (200, b"")
    http.fetch(static_pages.base_url + "/m", timeout=2, api_key="k-123")
    sent = static_pages.requests[0]["headers"]
    assert sent["authorization"] == "Bearer k-123"
    assert sent["user-agent"] == http.USER_AGENT


def test_http_error_status_is_a_response_not_an_exception(static_pages):
    status, _headers, body, _elapsed = http.fetch(static_pages.base_url + "/missing", timeout=2)
    assert status == 404
    assert body == b"not found\n"


def test_connection_refused_is_kind_connection(closed_port):
    with pytest.raises(http.HttpError) as info:
        http.fetch("http://127.0.0.1:%d/metrics" % closed_port, timeout=2, api_key="never-shown")
    assert info.value.kind == http.KIND_CONNECTION
    assert "refused" in info.value.message
    assert "never-shown" not in repr(info.value.to_dict())


def test_slow_server_times_out_quickly(static_pages):
    # The server would answer after 5 s; the 0.3 s timeout must cut it well before (the
    # margin is wide: make check shares two cores with the GPU contract's venv build).
    static_pages.delay = 5.0
    static_pages.pages["/metrics"] = (200, b"x 1\n")
    started = time.monotonic()
    with pytest.raises(http.HttpError) as info:
        http.fetch(static_pages.base_url + "/metrics", timeout=0.3)
    assert info.value.kind == http.KIND_TIMEOUT
    assert time.monotonic() - started < 3.5


@pytest.mark.parametrize("url", ["ftp://example/x", "not a url", "http://"])
def test_invalid_url(url):
    with pytest.raises(http.HttpError) as info:
        http.fetch(url, timeout=1)
    assert info.value.kind == http.KIND_INVALID


def test_timeout_is_mandatory():
    with pytest.raises(http.HttpError) as info:
        http.open_request("http://127.0.0.1:1/", timeout=0)
    assert info.value.kind == http.KIND_INVALID


def test_redact():
    assert http.redact("key abc and abc", ["abc", None, ""]) == "key ******** and ********"
    assert http.redact(None, ["x"]) is None


class _FakeResponse(object):
    """Feeds iter_sse from bytes (the parsing, without a socket)."""

    def __init__(self, data):
        self._buf = io.BytesIO(data)

    def readline(self):
        return self._buf.readline()

    def elapsed(self):
        return 0.5


def test_iter_sse_handles_comments_crlf_multiline_and_tail():
    raw = (b": keep-alive comment\r\n"
           b"data: {\"a\": 1}\r\n\r\n"
           b"event: message\n"
           b"data: line1\n"
           b"data:line2\n\n"
           b"\n"
           b"data: [DONE]")
    events = [data for _t, data in http.iter_sse(_FakeResponse(raw))]
    assert events == ['{"a": 1}', "line1\nline2", "[DONE]"]


def test_ssl_context_modes(tmp_path):
    import ssl
    assert http.build_ssl_context(False).verify_mode == ssl.CERT_NONE
    assert http.build_ssl_context(True).verify_mode == ssl.CERT_REQUIRED
