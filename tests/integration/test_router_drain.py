"""A node's instances leave the vllm_router before a restart and rejoin it after
(the tasks of playbooks/tasks/router_drain.yml, shared by playbooks/nodes.yml's rolling restart and
playbooks/rolling_upgrade.yml), run by ansible-playbook on this machine against a TEST DOUBLE of
vllm-router 0.1.17's worker API and of one vLLM instance, both on loopback.

What the double keeps of the real router (the role's pinned vllm-router; the lab runs the real
one: tests/integration/lab/test_switches.py, test_rolling_upgrade.py): GET /list_workers
answers {"urls": [...]}; POST /remove_worker?url= removes a listed worker (200) and answers 404
for an unknown one; POST /add_worker?url= checks the worker's /health first and adds it only
when that answers 200 (else 400). The instance double serves /health and a /metrics with
vllm:num_requests_running, which stays 1 for its first scrapes (requests still being served).

The lab proves the drain under load; these prove the paths the lab does not take: a router
that does not answer (site.yml's first converge: its router stage runs after the nodes) and
the error rolling_upgrade.yml gives then, and that the drain waits for the instance's requests.
"""
import http.server
import json
import os
import socket
import subprocess
import threading
import urllib.parse
import urllib.request

import pytest

from conftest import ROOT, _ansible_playbook, ansible_env, flat, recap

HERE = os.path.join(ROOT, "tests", "integration", "router_drain")


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


class _Handler(http.server.BaseHTTPRequestHandler):
    """Quiet; _send answers with a body."""

    def log_message(self, *args):
        pass

    def _send(self, status, body, content_type="text/plain"):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _serve(handler):
    server = _Server(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class InstanceDouble:
    """One vLLM instance: /health 200, /metrics busy for its first `busy_scrapes` scrapes."""

    def __init__(self, busy_scrapes=2):
        self.scrapes = 0
        double = self

        class Handler(_Handler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                if self.path == "/health":
                    return self._send(200, b"")
                if self.path == "/metrics":
                    double.scrapes += 1
                    running = 1 if double.scrapes <= busy_scrapes else 0
                    return self._send(200, ('vllm:num_requests_running{model_name="tiny"} %d\n'
                                            'vllm:num_requests_waiting{model_name="tiny"} 0\n' % running).encode())
                return self._send(404, b"")

        self.server = _serve(Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]


class RouterDouble:
    """vllm-router's worker API (see the module's docstring); every call in `calls`."""

    def __init__(self, workers):
        self.workers = list(workers)
        self.calls = []
        double = self

        class Handler(_Handler):
            def do_GET(self):  # noqa: N802
                double.calls.append(("GET", self.path))
                if self.path == "/list_workers":  # a JSON response, as axum's Json gives
                    return self._send(200, json.dumps({"urls": double.workers}).encode(), "application/json")
                return self._send(404, b"")

            def do_POST(self):  # noqa: N802
                parsed = urllib.parse.urlparse(self.path)
                url = urllib.parse.parse_qs(parsed.query).get("url", [""])[0]
                double.calls.append(("POST", parsed.path, url))
                if parsed.path == "/remove_worker":
                    if url not in double.workers:
                        return self._send(404, b"Worker not found")
                    double.workers.remove(url)
                    return self._send(200, b"Successfully removed worker")
                if parsed.path == "/add_worker":
                    try:
                        with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                            healthy = resp.status == 200
                    except OSError:
                        healthy = False
                    if not healthy:
                        return self._send(400, b"Worker failed health check")
                    if url not in double.workers:
                        double.workers.append(url)
                    return self._send(200, b"Successfully added worker")
                return self._send(404, b"")

        self.server = _serve(Handler)
        self.port = self.server.server_address[1]


def _closed_port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def _drain(tmp_path, router_port, instance_url, required):
    port = int(instance_url.rsplit(":", 1)[1])
    extra = {"router_internal_port": router_port, "drain_required": required,
             "vllm_instances": [{"name": "gpu0", "port": port, "gpus": [0]}],
             "kvcache_router_drain_timeout": 20}
    return subprocess.run(
        [_ansible_playbook(), "-i", os.path.join(HERE, "inventory.yml"), os.path.join(HERE, "playbook.yml"),
         "-e", json.dumps(extra), "-e", "ansible_python_interpreter=%s" % os.path.join(os.path.dirname(_ansible_playbook()), "python")],
        env=ansible_env(tmp_path), cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture
def instance():
    double = InstanceDouble()
    yield double
    double.server.shutdown()


def test_the_node_leaves_waits_for_its_requests_and_rejoins(tmp_path, instance):
    other = "http://127.0.0.1:1"  # another node's instance: never touched
    router = RouterDouble([instance.url, other])
    try:
        proc = _drain(tmp_path, router.port, instance.url, required=True)
    finally:
        router.server.shutdown()
    out = flat(proc.stdout + proc.stderr)
    assert proc.returncode == 0, out[-3000:]
    assert "router_drained=True" in out, out[-3000:]
    posts = [call for call in router.calls if call[0] == "POST"]
    assert posts == [("POST", "/remove_worker", instance.url), ("POST", "/add_worker", instance.url)], router.calls
    # the drain waited until the instance's running requests reached 0 (busy for 2 scrapes)
    assert instance.scrapes == 3, instance.scrapes
    # after the rejoin the router lists both again; it was asked, and the play checked it
    assert sorted(router.workers) == sorted([instance.url, other])
    assert router.calls[-1] == ("GET", "/list_workers"), router.calls
    assert recap(proc.stdout, "gpu-node")["failed"] == 0


def test_a_router_that_does_not_answer_is_not_an_error_for_a_rolling_restart(tmp_path, instance):
    proc = _drain(tmp_path, _closed_port(), instance.url, required=False)
    out = flat(proc.stdout + proc.stderr)
    assert proc.returncode == 0, out[-3000:]
    assert "does not answer at http://127.0.0.1:" in out and "gpu-node restarts without leaving it" in out, out[-3000:]
    assert "router_drained=False" in out, out[-3000:]
    # nothing was drained or rejoined (no change reported), the instance was not even scraped
    assert recap(proc.stdout, "gpu-node")["changed"] == 0, out[-3000:]
    assert instance.scrapes == 0


def test_a_router_that_does_not_answer_fails_an_upgrade_before_anything_restarts(tmp_path, instance):
    port = _closed_port()
    proc = _drain(tmp_path, port, instance.url, required=True)
    out = flat(proc.stdout + proc.stderr)
    assert proc.returncode != 0, out[-3000:]
    assert ("Host gpu-node: the vllm_router on router-host (http://127.0.0.1:%d/list_workers) did not answer" % port) in out, out[-3000:]
    assert "Nothing was restarted. Fix: start the router (playbooks/router.yml) or check router_host/router_port." in out
    assert "router_drained=" not in out
    assert instance.scrapes == 0
