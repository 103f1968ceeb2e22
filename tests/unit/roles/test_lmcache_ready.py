"""roles/lmcache/files/lmcache_ready.py: the LMCache server unit's readiness gate (ExecStartPost)."""
from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "..", "roles", "lmcache", "files", "lmcache_ready.py")


class _Health(http.server.BaseHTTPRequestHandler):
    """Answers 503 to the first `not_ready` requests, then 200 (a server allocating its L1)."""
    not_ready = 2
    seen = 0

    def do_GET(self):  # noqa: N802 (http.server's name)
        type(self).seen += 1
        self.send_response(200 if type(self).seen > type(self).not_ready else 503)
        self.end_headers()

    def log_message(self, *_args):
        pass


def _run(*args):
    return subprocess.run([sys.executable, SCRIPT] + list(args), capture_output=True, text=True, timeout=60, check=False)


def test_waits_until_the_health_check_answers_200():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        proc = _run("http://127.0.0.1:%d/healthcheck" % server.server_port, "30")
    finally:
        server.shutdown()
    assert proc.returncode == 0, proc.stderr
    assert _Health.seen == 3


def test_fails_after_its_deadline_naming_the_url():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    proc = _run("http://127.0.0.1:%d/healthcheck" % port, "2")
    assert proc.returncode == 1
    assert "did not answer http://127.0.0.1:%d/healthcheck within 2 s" % port in proc.stderr


def test_bad_arguments_exit_2():
    assert _run().returncode == 2
