"""Test double for the vLLM production-stack router image (molecule only).

No registry is reachable here, so molecule/router_container builds an image from local parts
(this script and the test container's own Python) under the pinned production-stack image
name. It accepts the real router's command-line flags (names and choices as in
vllm_router/parsers/parser.py; anything else is an error, as with argparse there), serves
/health, /metrics and /v1/models, and forwards /v1/* to the static backends round robin with
the client's Authorization header, like the real router.
"""
import argparse
import itertools
import json
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

parser = argparse.ArgumentParser(prog="vllm-router")
parser.add_argument("--host", default="0.0.0.0")
parser.add_argument("--port", type=int, default=8001)
parser.add_argument("--service-discovery", choices=["static", "k8s"], required=True)
parser.add_argument("--static-backends")
parser.add_argument("--static-models")
parser.add_argument("--static-model-types")
parser.add_argument("--static-backend-health-checks", action="store_true")
parser.add_argument("--routing-logic", required=True,
                    choices=["roundrobin", "session", "kvaware", "prefixaware", "disaggregated_prefill", "priority"])
parser.add_argument("--session-key")
parser.add_argument("--lmcache-controller-port", type=int, default=9000)
args = parser.parse_args()
if args.routing_logic == "session" and not args.session_key:
    sys.exit("Session key must be provided when using session routing logic.")
backends = args.static_backends.split(",")
models = args.static_models.split(",")
if len(backends) != len(models):
    sys.exit("URLs and models should have the same length")
if args.static_backend_health_checks and not args.static_model_types:
    sys.exit("Static model types must be provided when using the backend healthcheck.")
cycle = itertools.cycle(backends)
lock = threading.Lock()
served = {"requests": 0}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _reply(self, code, data, ctype="application/json"):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
        path = self.path.split("?")[0]
        if path == "/health":
            return self._reply(200, b'{"status":"healthy"}')
        if path == "/metrics":
            return self._reply(200, ("vllm_router_requests_total %d\n" % served["requests"]).encode(), "text/plain")
        if path == "/v1/models":
            data = [{"id": m, "object": "model", "owned_by": "vllm"} for m in sorted(set(models))]
            return self._reply(200, json.dumps({"object": "list", "data": data}).encode())
        with lock:
            backend = next(cycle)
            served["requests"] += 1
        headers = {"Content-Type": self.headers.get("Content-Type", "application/json")}
        if self.headers.get("Authorization"):
            headers["Authorization"] = self.headers["Authorization"]
        req = urllib.request.Request(backend + self.path, data=body, headers=headers, method=self.command)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return self._reply(resp.status, resp.read())
        except urllib.error.HTTPError as err:
            return self._reply(err.code, err.read())

    do_GET = do_POST = _handle


ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()
