# -*- coding: utf-8 -*-
# Copyright: kvcache.offload contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Small HTTP client for the validation modules.

Standard library only (urllib + ssl). Every call has a timeout: ``timeout`` bounds the
connect and every single socket read, ``deadline`` (seconds from the start of the call)
bounds the whole exchange, so a server that trickles bytes cannot hang a run.

The API key is sent as ``Authorization: Bearer <key>`` and never appears in an
exception, a returned header dict or a message produced here.
"""

from __future__ import annotations

import errno
import json
import socket
import ssl
import time

from urllib import error as urllib_error
from urllib import request as urllib_request
from urllib.parse import urlsplit

USER_AGENT = "kvcache.offload-validation/1"

# Error kinds returned in HttpError.kind (documented in the modules' RETURN).
KIND_HTTP = "http"  # the server answered with an unexpected status
KIND_CONNECTION = "connection"  # refused, reset, unreachable
KIND_DNS = "dns"  # the host name does not resolve
KIND_TIMEOUT = "timeout"  # connect/read timeout or deadline exceeded
KIND_TLS = "tls"  # certificate or handshake failure
KIND_PROTOCOL = "protocol"  # malformed response (bad SSE, bad JSON, truncated)
KIND_INVALID = "invalid"  # bad URL


class HttpError(Exception):
    """A failed HTTP exchange, with a machine-readable kind."""

    def __init__(self, kind, message, url=None, status=None, body=None, elapsed=None):
        super(HttpError, self).__init__(message)
        self.kind = kind
        self.message = message
        self.url = url
        self.status = status
        self.body = body
        self.elapsed = elapsed

    def to_dict(self):
        return {
            "kind": self.kind,
            "message": self.message,
            "url": self.url,
            "status": self.status,
            "body": self.body,
            "elapsed": self.elapsed,
        }


def redact(text, secrets):
    """Replace every occurrence of every non-empty secret in text."""
    if not text:
        return text
    for secret in secrets or ():
        if secret:
            text = text.replace(secret, "********")
    return text


def build_ssl_context(validate_certs=True, ca_path=None):
    if not validate_certs:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    return ssl.create_default_context(cafile=ca_path) if ca_path else ssl.create_default_context()


class _NoRedirect(urllib_request.HTTPRedirectHandler):
    """Redirects are reported, not followed: an Authorization header must not leak to another host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def _opener(validate_certs, ca_path):
    context = build_ssl_context(validate_certs, ca_path)
    return urllib_request.build_opener(urllib_request.HTTPSHandler(context=context), _NoRedirect())


def _classify(exc):
    """Map a socket/urllib/ssl exception to (kind, message)."""
    reason = getattr(exc, "reason", None)
    inner = reason if isinstance(reason, BaseException) else exc
    if isinstance(inner, socket.timeout) or isinstance(exc, socket.timeout):
        return KIND_TIMEOUT, "timed out"
    if isinstance(inner, socket.gaierror):
        return KIND_DNS, "name resolution failed: %s" % inner
    if isinstance(inner, ssl.SSLError) or isinstance(inner, ssl.CertificateError):
        return KIND_TLS, "TLS failure: %s" % inner
    if isinstance(inner, ConnectionRefusedError):
        return KIND_CONNECTION, "connection refused"
    if isinstance(inner, OSError) and inner.errno in (errno.ETIMEDOUT,):
        return KIND_TIMEOUT, "timed out"
    if isinstance(inner, (ConnectionError, OSError)):
        return KIND_CONNECTION, "connection failed: %s" % inner
    return KIND_CONNECTION, "request failed: %s" % (reason or exc)


def _check_url(url):
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise HttpError(KIND_INVALID, "not an http(s) URL: %s" % url, url=url)


def make_headers(api_key=None, headers=None, accept=None, content_type=None):
    out = {"User-Agent": USER_AGENT}
    if accept:
        out["Accept"] = accept
    if content_type:
        out["Content-Type"] = content_type
    for key, value in (headers or {}).items():
        out[str(key)] = str(value)
    if api_key:
        out["Authorization"] = "Bearer %s" % api_key
    return out


class Response(object):
    """An open response; use as a context manager or call close()."""

    def __init__(self, raw, url, started, deadline):
        self.raw = raw
        self.url = url
        self.status = raw.getcode()
        self.headers = dict((k.lower(), v) for k, v in raw.headers.items())
        self.started = started
        self.deadline = deadline

    def elapsed(self):
        return time.monotonic() - self.started

    def _check_deadline(self):
        if self.deadline is not None and self.elapsed() > self.deadline:
            raise HttpError(KIND_TIMEOUT, "deadline of %ss exceeded" % self.deadline, url=self.url, status=self.status, elapsed=self.elapsed())

    def readline(self):
        self._check_deadline()
        try:
            line = self.raw.readline()
        except (socket.timeout, OSError) as exc:
            kind, msg = _classify(exc)
            raise HttpError(kind, "reading the response: %s" % msg, url=self.url, status=self.status, elapsed=self.elapsed())
        self._check_deadline()
        return line

    def read(self, limit=None):
        chunks = []
        total = 0
        while True:
            self._check_deadline()
            try:
                chunk = self.raw.read(65536)
            except (socket.timeout, OSError) as exc:
                kind, msg = _classify(exc)
                raise HttpError(kind, "reading the response: %s" % msg, url=self.url, status=self.status, elapsed=self.elapsed())
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if limit is not None and total > limit:
                raise HttpError(KIND_PROTOCOL, "response larger than %d bytes" % limit, url=self.url, status=self.status, elapsed=self.elapsed())
        return b"".join(chunks)

    def close(self):
        try:
            self.raw.close()
        except Exception:  # pylint: disable=broad-except
            pass

    def __enter__(self):
        return self

    def __exit__(self, *args):
        self.close()


def open_request(url, method="GET", body=None, headers=None, timeout=10.0, deadline=None,
                 validate_certs=True, ca_path=None, api_key=None, accept=None, content_type=None):
    """Open a request and return a Response (status may be any value, including 4xx/5xx).

    Raises HttpError for everything that is not an HTTP answer (refused, DNS, TLS, timeout).
    """
    _check_url(url)
    if timeout is None or timeout <= 0:
        raise HttpError(KIND_INVALID, "a positive timeout is required", url=url)
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode("utf-8")
        content_type = content_type or "application/json"
    req = urllib_request.Request(url, data=body, method=method,
                                 headers=make_headers(api_key, headers, accept=accept, content_type=content_type))
    started = time.monotonic()
    secrets = [api_key] if api_key else []
    try:
        raw = _opener(validate_certs, ca_path).open(req, timeout=timeout)
    except urllib_error.HTTPError as exc:
        # A real HTTP answer (4xx/5xx, or a redirect we refuse to follow).
        return Response(exc, url, started, deadline)
    except urllib_error.URLError as exc:
        kind, msg = _classify(exc)
        raise HttpError(kind, redact(msg, secrets), url=url, elapsed=time.monotonic() - started)
    except (socket.timeout, OSError, ValueError) as exc:
        if isinstance(exc, ValueError):
            raise HttpError(KIND_INVALID, redact(str(exc), secrets), url=url)
        kind, msg = _classify(exc)
        raise HttpError(kind, redact(msg, secrets), url=url, elapsed=time.monotonic() - started)
    return Response(raw, url, started, deadline)


def fetch(url, timeout=10.0, limit=64 * 1024 * 1024, **kwargs):
    """GET (or other method) a whole body. Returns (status, headers, body bytes, elapsed seconds)."""
    deadline = kwargs.pop("deadline", None)
    if deadline is None:
        deadline = timeout * 3
    with open_request(url, timeout=timeout, deadline=deadline, **kwargs) as resp:
        body = resp.read(limit=limit)
        return resp.status, resp.headers, body, resp.elapsed()


def iter_sse(response):
    """Yield (elapsed_seconds, data_string) for every SSE event of an open response.

    Handles multi-line data fields, comments (lines starting with ':') and CRLF line
    endings. Stops at end of stream. The caller decides what '[DONE]' means.
    """
    data_lines = []
    while True:
        line = response.readline()
        if not line:
            if data_lines:
                yield response.elapsed(), "\n".join(data_lines)
            return
        text = line.decode("utf-8", errors="replace").rstrip("\r\n")
        if text == "":
            if data_lines:
                yield response.elapsed(), "\n".join(data_lines)
                data_lines = []
            continue
        if text.startswith(":"):
            continue
        field, sep, value = text.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if field == "data":
            data_lines.append(value)
