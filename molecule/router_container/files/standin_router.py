"""Test double for the vLLM production-stack router image (molecule only).

No registry is reachable here, so molecule/router_container builds an image from local parts
(this script and the test container's own Python) under the pinned production-stack image
name. It accepts the real router's command-line flags (names and choices as in
vllm_router/parsers/parser.py; anything else is an error, as with argparse there), serves
/health, /metrics and /v1/models, and forwards /v1/* to the static backends round robin with
the client's Authorization header, like the real router.

With --static-backend-health-checks it checks every backend as production-stack 0.1.12 does
(vllm_router/utils.py is_model_healthy, service_discovery.py StaticServiceDiscovery): at start
and then every --static-backend-health-check-interval seconds (default 60) it POSTs a tiny
request for the backend's model type ("chat": /v1/chat/completions, messages "Hello",
max_tokens 3) with only a Content-Type header, NO Authorization (upstream sends none), and
routes to the backends that answered 2xx with JSON only. With none left it answers 503.
GET /engines lists the backends it routes to, as upstream's does (no URLs, one card each).
"""
import argparse
import itertools
import json
import sys
import threading
import time
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
parser.add_argument("--static-backend-health-check-interval", type=int, default=60)
parser.add_argument("--static-backend-health-check-timeout-seconds", type=int, default=10)
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
if args.static_backend_health_checks and len(args.static_model_types.split(",")) != len(backends):
    sys.exit("To perform health check, each model has to define a static_model_type")
cycle = itertools.cycle(backends)
lock = threading.Lock()
served = {"requests": 0}
# Backends the last health check found unhealthy (upstream: unhealthy_endpoint_hashes).
unhealthy = set()
STARTED = int(time.time())
TEST_PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}
TEST_PAYLOADS = {
    "chat": {"messages": [{"role": "user", "content": "Hello"}], "temperature": 0.0, "max_tokens": 3},
    "completion": {"prompt": "Hello", "max_tokens": 3},
}


def is_model_healthy(url, model, model_type):
    """upstream utils.is_model_healthy: no Authorization header."""
    body = json.dumps(dict({"model": model}, **TEST_PAYLOADS[model_type])).encode()
    req = urllib.request.Request(url + TEST_PATHS[model_type], data=body,
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=args.static_backend_health_check_timeout_seconds) as resp:
            json.loads(resp.read())
            return True
    except (OSError, ValueError):
        return False


def check_health_forever():
    types = args.static_model_types.split(",")
    while True:
        found = {u for u, m, t in zip(backends, models, types) if not is_model_healthy(u, m, t)}
        with lock:
            unhealthy.clear()
            unhealthy.update(found)
        for url in sorted(found):
            print("%s at %s not healthy!" % (models[backends.index(url)], url), flush=True)
        time.sleep(args.static_backend_health_check_interval)


if args.static_backend_health_checks:
    threading.Thread(target=check_health_forever, daemon=True).start()


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
        if path == "/engines":
            # upstream main_router.get_engine_instances: one card per endpoint it routes to
            # (get_endpoint_info leaves out the unhealthy ones)
            with lock:
                cards = [{"engine_id": "engine-%d" % i, "serving_models": [m], "created": STARTED}
                         for i, (b, m) in enumerate(zip(backends, models)) if b not in unhealthy]
            return self._reply(200, json.dumps(cards).encode())
        if path == "/v1/models":
            data = [{"id": m, "object": "model", "owned_by": "vllm"} for m in sorted(set(models))]
            return self._reply(200, json.dumps({"object": "list", "data": data}).encode())
        with lock:
            healthy = [b for b in backends if b not in unhealthy]
            if not healthy:
                return self._reply(503, b'{"error": "no healthy backend"}')
            backend = next(cycle)
            while backend in unhealthy:
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
