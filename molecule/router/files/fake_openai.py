"""Test double for a vLLM instance: a tiny OpenAI-compatible server for the router tests.

Answers /health, /metrics, /v1/models and /v1/chat/completions like vLLM does (the API key,
from FAKE_API_KEY, guards /v1 only), and records every request it receives: GET /_requests
returns the count per path and per Authorization header seen on /v1 ("None" when absent).
Usage: fake_openai.py PORT (binds 127.0.0.1).
"""
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = int(sys.argv[1])
KEY = os.environ.get("FAKE_API_KEY", "")
MODEL = os.environ.get("FAKE_MODEL", "tiny-test")
LOCK = threading.Lock()
SEEN = {"counts": {}, "v1_authorization": {}, "port": PORT, "pid": os.getpid()}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _reply(self, code, body, ctype="application/json"):
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        path = self.path.split("?")[0]
        if path == "/_requests":
            with LOCK:
                return self._reply(200, SEEN)
        with LOCK:
            key = "%s %s" % (self.command, path)
            SEEN["counts"][key] = SEEN["counts"].get(key, 0) + 1
            if path.startswith("/v1/"):
                auth = str(self.headers.get("Authorization"))
                SEEN["v1_authorization"][auth] = SEEN["v1_authorization"].get(auth, 0) + 1
        if path == "/health":
            return self._reply(200, "", "text/plain")
        if path == "/metrics":
            return self._reply(200, "fake_requests_total %d\n" % sum(SEEN["counts"].values()), "text/plain")
        if KEY and self.headers.get("Authorization") != "Bearer " + KEY:
            return self._reply(401, {"error": "Unauthorized"})
        if path == "/v1/models":
            return self._reply(200, {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "test-double"}]})
        if path in ("/v1/chat/completions", "/v1/completions"):
            return self._reply(200, {"id": "cmpl-%d" % PORT, "object": "chat.completion", "model": MODEL,
                                     "choices": [{"index": 0, "finish_reason": "stop",
                                                  "message": {"role": "assistant", "content": "backend %d" % PORT}}],
                                     "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
        return self._reply(404, {"error": "not found"})

    do_GET = do_POST = _handle


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
