"""Recording HTTP server shared by the test doubles (standard library only)."""
import base64
import json
import os
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit


def self_signed_cert(directory):
    """A throw-away CA and a certificate it signed for 127.0.0.1 / localhost.

    Clients either skip the check (validate_certs false) or trust the CA file
    (`RecordingServer.ca_file`), as they would a site CA or a cluster's own certificate.
    """
    ca, ca_key = os.path.join(directory, "double-ca.crt"), os.path.join(directory, "double-ca.key")
    cert, key = os.path.join(directory, "double.crt"), os.path.join(directory, "double.key")
    if not os.path.exists(cert):
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                        "-subj", "/CN=kvcache test double CA", "-keyout", ca_key, "-out", ca],
                       check=True, capture_output=True, timeout=60)
        csr = os.path.join(directory, "double.csr")
        subprocess.run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
                        "-keyout", key, "-out", csr], check=True, capture_output=True, timeout=60)
        ext = os.path.join(directory, "double.ext")
        with open(ext, "w", encoding="utf-8") as handle:
            handle.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n")
        subprocess.run(["openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
                        "-days", "1", "-extfile", ext, "-out", cert], check=True, capture_output=True, timeout=60)
    return cert, key


class Request(dict):
    """One recorded request: method, path, query (dict), body (parsed JSON or raw text), user,
    raw (the body's bytes), headers (dict, names in lower case)."""

    @property
    def call(self):
        return "%s %s" % (self["method"], self["path"])


class RecordingServer:
    """Serve `handle(request) -> (status, body, headers)` on 127.0.0.1 and record every request."""

    def __init__(self, handle, tls_dir=None):
        self.requests = []
        self._handle = handle
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep pytest output clean
                pass

            def _serve(self):
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw and "json" in (self.headers.get("Content-Type") or "") else None
                except ValueError:
                    body = None
                if body is None and raw:
                    body = raw.decode("utf-8", "replace")
                user = None
                auth = self.headers.get("Authorization") or ""
                if auth.startswith("Basic "):
                    user = base64.b64decode(auth[6:]).decode().split(":", 1)
                elif auth:
                    user = auth.split(" ", 1)
                req = Request(method=self.command, path=parts.path,
                              query=dict(parse_qsl(parts.query, keep_blank_values=True)),
                              body=body, user=user, host=self.headers.get("Host"), raw=raw,
                              headers={k.lower(): v for k, v in self.headers.items()})
                with outer._lock:
                    outer.requests.append(req)
                    status, payload, headers = outer._handle(req)
                if isinstance(payload, (dict, list)):
                    data = json.dumps(payload).encode()
                    ctype = "application/json"
                else:
                    data = (payload or "").encode()
                    ctype = (headers or {}).pop("Content-Type", "application/xml")
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = do_HEAD = _serve

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.scheme = "http"
        self.ca_file = None
        if tls_dir:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self_signed_cert(tls_dir))
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
            self.scheme = "https"
            self.ca_file = os.path.join(tls_dir, "double-ca.crt")
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def calls(self, mutating_only=False):
        """'METHOD /path' strings in order; with mutating_only, no GETs."""
        return [r.call for r in self.requests if not mutating_only or r["method"] not in ("GET", "HEAD")]

    def clear(self):
        with self._lock:
            del self.requests[:]


def expand(flat):
    """{'a.b': 1, 'c': {'d.e': 2}} -> {'a': {'b': 1}, 'c': {'d': {'e': 2}}} (ONTAP accepts dotted keys)."""
    out = {}
    for key, value in (flat or {}).items():
        if isinstance(value, dict):
            value = expand(value)
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        if isinstance(value, dict) and isinstance(node.get(parts[-1]), dict):
            merge(node[parts[-1]], value)
        else:
            node[parts[-1]] = value
    return out


def merge(into, new):
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value
    return into


def lookup(record, dotted):
    node = record
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node
