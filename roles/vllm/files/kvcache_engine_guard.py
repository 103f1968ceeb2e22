# Installed by the kvcache.offload vllm role (roles/vllm/files/kvcache_engine_guard.py).
"""kvcache.offload engine guard: every HTTP path of a vLLM API server asks for the API key.

vLLM's own ``--api-key`` (or ``VLLM_API_KEY``) guards the paths under ``/v1``, ``/v2``,
``/inference`` and ``/cohere`` only (vllm/entrypoints/serve/middleware/authenticate.py,
GUARDED_PREFIX): ``POST /invocations`` (SageMaker), ``/tokenize``, ``/pooling``, ``/score``,
``/classify``, ``/rerank``, ``/version``, ``/server_info``, the admin paths and whatever a
later vLLM adds answer anyone. This ASGI middleware inverts the rule: a request passes only
with ``Authorization: Bearer <key>``, except ``GET`` of an open path (exact match; default
``/health`` and ``/metrics``, the paths the fleet's probes, drain tasks and monitoring read
without a key).

vLLM loads it with ``--middleware kvcache_engine_guard.EngineGuard`` (a class: vLLM calls
``app.add_middleware(EngineGuard)``, which makes it the outermost of vLLM's middlewares).
Settings come from the environment the unit gives the server, never from its command line:

- ``VLLM_API_KEY``: the key (the role's root-only EnvironmentFile). Missing or empty: the
  guard refuses to start (RuntimeError), so an engine never serves without it.
- ``KVCACHE_GUARD_OPEN_PATHS``: the open paths, separated by spaces (default
  ``/health /metrics``); each starts with ``/``.

The key is compared as SHA-256 digests with ``hmac.compare_digest`` (constant time, and the
length of the key does not show either). Pure ASGI, standard library only: it runs on any
vLLM whose ``--middleware`` takes a class.
"""
import hashlib
import hmac
import json
import os

KEY_ENV = "VLLM_API_KEY"
OPEN_PATHS_ENV = "KVCACHE_GUARD_OPEN_PATHS"
DEFAULT_OPEN_PATHS = ("/health", "/metrics")
# Methods an open path answers without a key: reads only.
OPEN_METHODS = frozenset(["GET"])

_BODY = json.dumps({"error": "Unauthorized"}).encode("ascii")


def _digest(value):
    return hashlib.sha256(value).digest()


def parse_open_paths(text):
    """The open paths of KVCACHE_GUARD_OPEN_PATHS: exact paths, each starting with '/'."""
    paths = tuple(text.split())
    bad = [p for p in paths if not p.startswith("/")]
    if bad:
        raise RuntimeError("kvcache_engine_guard: %s holds %s; every open path starts with '/'"
                           % (OPEN_PATHS_ENV, ", ".join(repr(p) for p in bad)))
    return paths


class EngineGuard(object):
    """ASGI middleware: the API key on every request but GET of an open path."""

    def __init__(self, app, api_key=None, open_paths=None):
        self.app = app
        if api_key is None:
            api_key = os.environ.get(KEY_ENV, "")
        if not api_key:
            raise RuntimeError(
                "kvcache_engine_guard: %s is empty or unset, refusing to serve without an API key "
                "(the vllm role writes it to the instance's root-only EnvironmentFile)" % KEY_ENV)
        self._key_digest = _digest(api_key.encode("utf-8"))
        if open_paths is None:
            env = os.environ.get(OPEN_PATHS_ENV)
            open_paths = DEFAULT_OPEN_PATHS if env is None else parse_open_paths(env)
        self.open_paths = frozenset(open_paths)

    def authorized(self, headers):
        """True when the request carries exactly one Authorization header with the key."""
        values = [v for k, v in headers or () if k.lower() == b"authorization"]
        if len(values) != 1:
            return False
        scheme, _sep, token = values[0].decode("latin-1").partition(" ")
        # Always one digest and one comparison, whatever the header holds.
        ok_scheme = scheme.lower() == "bearer"
        ok_token = hmac.compare_digest(_digest(token.encode("latin-1")), self._key_digest)
        return ok_scheme and ok_token

    def _path(self, scope):
        path = scope.get("path") or "/"
        root = scope.get("root_path") or ""
        if root and path.startswith(root):
            path = path[len(root):] or "/"
        return path

    def is_open(self, scope):
        return scope["type"] == "http" and scope.get("method") in OPEN_METHODS and self._path(scope) in self.open_paths

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):  # lifespan
            await self.app(scope, receive, send)
            return
        if self.is_open(scope) or self.authorized(scope.get("headers")):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            # Closing before accepting makes the server answer the handshake with HTTP 403.
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1008})
            return
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(_BODY)).encode("ascii")),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": _BODY})
