"""s3_vhost_probe against a local HTTP server playing the S3 endpoint; name resolution of
<bucket>.<domain> is pointed at 127.0.0.1 the way a wildcard DNS record would."""
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from ansible_collections.kvcache.offload.plugins.module_utils import http_client
from ansible_collections.kvcache.offload.plugins.modules import s3_vhost_probe

LISTING = (b'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
           b"<Name>kvcache</Name><MaxKeys>1</MaxKeys></ListBucketResult>")
ROOT = (b'<?xml version="1.0" encoding="UTF-8"?><ListAllMyBucketsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        b"<Buckets/></ListAllMyBucketsResult>")
DENIED = b"<Error><Code>SignatureDoesNotMatch</Code><Message>no</Message></Error>"
MISSING = b"<Error><Code>NoSuchBucket</Code><Message>no</Message></Error>"


@pytest.fixture
def endpoint(monkeypatch):
    seen = []
    answer = {"status": 200, "body": LISTING}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):  # noqa: N802
            seen.append({"host": self.headers["Host"], "path": self.path, "auth": self.headers.get("Authorization", ""),
                         "token": self.headers.get("X-Amz-Security-Token")})
            self.send_response(answer["status"])
            self.send_header("Content-Length", str(len(answer["body"])))
            self.end_headers()
            self.wfile.write(answer["body"])

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    real = socket.getaddrinfo

    def fake_getaddrinfo(host, port, *args, **kwargs):
        if host.endswith(".s3.lab.test"):
            return real("127.0.0.1", port, *args, **kwargs)
        if host.endswith(".test"):
            raise socket.gaierror(-2, "Name or service not known")
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(s3_vhost_probe.socket, "getaddrinfo", fake_getaddrinfo)
    real_conn = s3_vhost_probe.http_client.HTTPConnection
    monkeypatch.setattr(s3_vhost_probe.http_client, "HTTPConnection",
                        lambda host, port, timeout: real_conn("127.0.0.1", port, timeout=timeout))
    yield {"url": "http://s3.lab.test:%d" % server.server_address[1], "seen": seen, "answer": answer}
    server.shutdown()
    server.server_close()


def args(where, **extra):
    data = {"endpoint_url": where["url"], "bucket": "kvcache", "access_key": "AKPROBE", "secret_key": "probe-secret-000"}
    data.update(extra)
    return data


def test_bucket_answers_by_its_virtual_hosted_name(run_module, endpoint):
    result, failed = run_module(s3_vhost_probe, args(endpoint))
    assert not failed, result["msg"]
    assert result["reachable"] is True and result["status"] == 200
    assert result["host"] == "kvcache.s3.lab.test"
    assert result["addresses"] == ["127.0.0.1"]
    request = endpoint["seen"][0]
    assert request["host"].startswith("kvcache.s3.lab.test:")
    assert request["path"] == "/?list-type=2&max-keys=1"
    assert request["auth"].startswith("AWS4-HMAC-SHA256 Credential=AKPROBE/")


def test_name_that_does_not_resolve(run_module, endpoint):
    result, failed = run_module(s3_vhost_probe, args(endpoint, endpoint_url=endpoint["url"].replace("s3.lab.test", "nowhere.test")))
    assert failed and result["reachable"] is False
    assert "does not resolve" in result["msg"] and "*.nowhere.test" in result["msg"]


def test_endpoint_without_domain_answers_as_service_root(run_module, endpoint):
    endpoint["answer"].update(body=ROOT)
    result, failed = run_module(s3_vhost_probe, args(endpoint))
    assert failed and "endpoint domain" in result["msg"]


def test_wrong_keys(run_module, endpoint):
    endpoint["answer"].update(status=403, body=DENIED)
    result, failed = run_module(s3_vhost_probe, args(endpoint))
    assert failed and result["status"] == 403 and "kvcache_s3_secret_key" in result["msg"]
    assert "probe-secret-000" not in str(result)


def test_missing_bucket(run_module, endpoint):
    endpoint["answer"].update(status=404, body=MISSING)
    result, failed = run_module(s3_vhost_probe, args(endpoint))
    assert failed and "does not exist" in result["msg"]


def test_nothing_listening(run_module, endpoint):
    result, failed = run_module(s3_vhost_probe, args(endpoint, endpoint_url="http://s3.lab.test:1", timeout=2))
    assert failed and "does not answer" in result["msg"]


def test_endpoint_without_scheme(run_module):
    result, failed = run_module(s3_vhost_probe, {"endpoint_url": "s3.lab.test:8333", "bucket": "kvcache",
                                                 "access_key": "a", "secret_key": "b"})
    assert failed and "scheme" in result["msg"]


def test_https_uses_the_collections_tls_context_and_sends_the_session_token(run_module, endpoint, monkeypatch):
    # One TLS setup for every module: the one of module_utils/http_client.py.
    assert s3_vhost_probe.build_ssl_context is http_client.build_ssl_context
    made = {}

    def fake_context(validate_certs, ca_path):
        made.update(validate_certs=validate_certs, ca_path=ca_path)
        return "the-context"

    def https(host, port, timeout, context):
        made["context"] = context
        return s3_vhost_probe.http_client.HTTPConnection(host, port, timeout=timeout)  # plain HTTP to the local server

    monkeypatch.setattr(s3_vhost_probe, "build_ssl_context", fake_context)
    monkeypatch.setattr(s3_vhost_probe.http_client, "HTTPSConnection", https)
    result, failed = run_module(s3_vhost_probe, args(endpoint, endpoint_url=endpoint["url"].replace("http:", "https:"),
                                                     validate_certs=False, ca_path="/etc/ssl/grid-ca.pem",
                                                     session_token="temporary-token"))
    assert not failed, result["msg"]
    assert made == {"validate_certs": False, "ca_path": "/etc/ssl/grid-ca.pem", "context": "the-context"}
    request = endpoint["seen"][0]
    assert request["token"] == "temporary-token" and "x-amz-security-token" in request["auth"]


def test_timeout_must_be_positive(run_module, endpoint):
    result, failed = run_module(s3_vhost_probe, args(endpoint, timeout=0))
    assert failed and "timeout must be positive" in result["msg"] and not endpoint["seen"]
