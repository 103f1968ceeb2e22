"""Loopback HTTP test doubles for the validation modules' tests.

Both servers are real ``http.server`` instances on 127.0.0.1 with an OS-assigned port, so the
code under test goes through real sockets. They record the requests they receive; tests
assert on those records.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import time

from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")


def fixture_path(*parts):
    return os.path.join(FIXTURES, *parts)


def read_fixture(*parts):
    with open(fixture_path(*parts), "rb") as handle:
        return handle.read()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        # A client that timed out closes its socket; the resulting BrokenPipe is expected.
        pass


class _Base(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _send(self, status, body, content_type="application/json", headers=None):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)


class FakeOpenAI(object):
    """Test double of a vLLM OpenAI server's streaming /v1/chat/completions.

    - 401 {"error": "Unauthorized"} unless ``Authorization: Bearer <api_key>`` (as vLLM's middleware).
    - A prefix it has not seen costs ``cold_delay`` before the first token, a seen one ``warm_delay``
      (a stand-in for a prefix-cache hit).
    - mode: "ok", "hang_after_headers", "hang_before_headers", "no_done", "bad_json".
    """

    def __init__(self, api_key="sekrit-key", cold_delay=0.25, warm_delay=0.01, tokens=4):
        self.api_key = api_key
        self.cold_delay = cold_delay
        self.warm_delay = warm_delay
        self.tokens = tokens
        self.mode = "ok"
        self.requests = []
        self.seen_prefixes = set()
        self.release = threading.Event()
        self.server = None
        self.thread = None

    @property
    def base_url(self):
        return "http://127.0.0.1:%d" % self.server.server_address[1]

    def start(self):
        double = self

        class Handler(_Base):
            def do_POST(self):  # noqa: N802 (http.server API)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw.decode("utf-8"))
                except ValueError:
                    body = None
                auth = self.headers.get("Authorization")
                double.requests.append({
                    "path": self.path,
                    "authorization_ok": auth == "Bearer %s" % double.api_key,
                    "has_authorization": auth is not None,
                    "headers": dict((k.lower(), v) for k, v in self.headers.items() if k.lower() != "authorization"),
                    "body": body,
                })
                if self.path != "/v1/chat/completions":
                    self._send(404, b'{"detail":"Not Found"}')
                    return
                if auth != "Bearer %s" % double.api_key:
                    self._send(401, b'{"error":"Unauthorized"}')
                    return
                if double.mode == "hang_before_headers":
                    double.release.wait(30)
                    return
                prefix = body["messages"][0]["content"]
                digest = hashlib.sha256(prefix.encode("utf-8")).hexdigest()
                delay = double.warm_delay if digest in double.seen_prefixes else double.cold_delay
                double.seen_prefixes.add(digest)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream; charset=utf-8")
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("X-Backend-Url", "http://backend-1.test:8000")
                self.end_headers()

                def event(obj):
                    data = obj if isinstance(obj, str) else json.dumps(obj)
                    payload = ("data: %s\n\n" % data).encode("utf-8")
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
                    self.wfile.flush()

                base = {"id": "chatcmpl-test-%d" % len(double.requests), "object": "chat.completion.chunk",
                        "created": int(time.time()), "model": body["model"]}
                # vLLM sends the role chunk with empty content before the first token.
                event(dict(base, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]))
                if double.mode == "hang_after_headers":
                    double.release.wait(30)
                    return
                time.sleep(delay)
                if double.mode == "bad_json":
                    event("{not json")
                for i in range(double.tokens):
                    event(dict(base, choices=[{"index": 0, "delta": {"content": "tok%d " % i}, "finish_reason": None}]))
                event(dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": "length"}]))
                if body.get("stream_options", {}).get("include_usage"):
                    cached = 2048 if delay == double.warm_delay else 0
                    event(dict(base, choices=[], usage={"prompt_tokens": 2100, "completion_tokens": double.tokens,
                                                        "total_tokens": 2100 + double.tokens,
                                                        "prompt_tokens_details": {"cached_tokens": cached}}))
                if double.mode != "no_done":
                    event("[DONE]")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def stop(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


class StaticPages(object):
    """Serves a dict path -> (status, bytes); records each GET. Pages can be swapped between calls."""

    def __init__(self):
        self.pages = {}
        self.requests = []
        self.delay = 0.0
        self.server = None

    @property
    def base_url(self):
        return "http://127.0.0.1:%d" % self.server.server_address[1]

    def start(self):
        double = self

        class Handler(_Base):
            def do_GET(self):  # noqa: N802
                double.requests.append({"path": self.path, "headers": dict((k.lower(), v) for k, v in self.headers.items())})
                if double.delay:
                    time.sleep(double.delay)
                page = double.pages.get(self.path) or double.pages.get(self.path.split("?")[0]) or (404, b"not found\n")
                status, body = page[0], page[1]
                content_type = page[2] if len(page) > 2 else "text/plain; version=0.0.4; charset=utf-8"
                self._send(status, body, content_type=content_type)

        self.server = _Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_openai():
    double = FakeOpenAI().start()
    yield double
    double.stop()


@pytest.fixture
def static_pages():
    double = StaticPages().start()
    yield double
    double.stop()


@pytest.fixture
def closed_port():
    """A loopback port nothing listens on (connection refused)."""
    import socket
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port
