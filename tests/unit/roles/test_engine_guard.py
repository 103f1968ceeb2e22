"""roles/vllm/files/kvcache_engine_guard.py, the engine guard (issue #32): vLLM's --api-key guards
/v1 only, and POST /invocations answered a completion without a key on every lab engine. The guard
asks every request for the key but a GET of an open path, driven here as vLLM drives it: a raw ASGI
app wrapped by the middleware class (vLLM: app.add_middleware(EngineGuard))."""
import asyncio
import hmac
import importlib.util
import os

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
SPEC = importlib.util.spec_from_file_location(
    "kvcache_engine_guard", os.path.join(ROOT, "roles", "vllm", "files", "kvcache_engine_guard.py"))
guard_module = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(guard_module)
EngineGuard = guard_module.EngineGuard

KEY = "test-key-not-a-secret-0123456789abcdef"

# Paths vLLM 0.32 serves outside /v1 (vllm/entrypoints/**: @router.*), none of which its own
# --api-key guards, and some it does; all must ask for the key.
GUARDED = ["/invocations", "/tokenize", "/detokenize", "/pooling", "/score", "/rerank", "/classify",
           "/version", "/server_info", "/load", "/ping", "/reset_prefix_cache", "/sleep", "/collective_rpc",
           "/docs", "/openapi.json", "/v1/chat/completions", "/v1/completions", "/v1/models",
           "/health/", "/healthz", "/metrics/", "/metricsx", "/", "/HEALTH"]


class App(object):
    """The wrapped app: records what reached it and answers 200."""

    def __init__(self):
        self.calls = []

    async def __call__(self, scope, receive, send):
        self.calls.append(scope)
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})


def request(guard, path, method="POST", headers=(), root_path="", kind="http"):
    """Run one request through the guard; (status or websocket close code, body, app calls)."""
    sent = []
    scope = {"type": kind, "path": path, "root_path": root_path, "headers": [(k.lower(), v) for k, v in headers]}
    if kind == "http":
        scope["method"] = method

    async def receive():
        return {"type": "websocket.connect"} if kind == "websocket" else {"type": "http.request", "body": b"{}"}

    async def send(message):
        sent.append(message)

    asyncio.run(guard(scope, receive, send))
    if kind == "websocket":
        return (sent[0].get("code") if sent else None), None
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


@pytest.fixture
def app():
    return App()


@pytest.fixture
def guard(app, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    monkeypatch.delenv("KVCACHE_GUARD_OPEN_PATHS", raising=False)
    return EngineGuard(app)


def bearer(key=KEY):
    return [(b"authorization", ("Bearer " + key).encode())]


@pytest.mark.parametrize("path", GUARDED)
@pytest.mark.parametrize("method", ["GET", "POST"])
def test_every_path_without_the_key_is_refused(guard, app, path, method):
    status, body = request(guard, path, method)
    assert (status, body) == (401, b'{"error": "Unauthorized"}')
    assert app.calls == []


@pytest.mark.parametrize("path", GUARDED)
def test_every_path_with_the_key_reaches_vllm(guard, app, path):
    assert request(guard, path, "POST", bearer())[0] == 200
    assert [c["path"] for c in app.calls] == [path]


@pytest.mark.parametrize("path", ["/health", "/metrics"])
def test_get_of_an_open_path_needs_no_key(guard, app, path):
    assert request(guard, path, "GET")[0] == 200
    assert len(app.calls) == 1


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "HEAD", "OPTIONS"])
def test_an_open_path_is_open_to_get_only(guard, app, method):
    assert request(guard, "/health", method)[0] == 401
    assert request(guard, "/metrics", method)[0] == 401
    assert app.calls == []


@pytest.mark.parametrize("headers", [
    bearer("wrong-" + KEY), bearer(KEY[:-1]), bearer(KEY + "x"), bearer(""),
    [(b"authorization", ("Basic " + KEY).encode())], [(b"authorization", KEY.encode())],
    [(b"x-api-key", KEY.encode())], bearer() + bearer(),  # two Authorization headers
])
def test_anything_but_the_bearer_key_is_refused(guard, app, headers):
    assert request(guard, "/invocations", "POST", headers)[0] == 401
    assert app.calls == []


def test_the_scheme_is_case_insensitive_and_the_header_name_too(guard, app):
    assert request(guard, "/invocations", "POST", [(b"Authorization", ("bearer " + KEY).encode())])[0] == 200


def test_the_key_is_compared_in_constant_time(guard, monkeypatch):
    calls = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((len(a), len(b)))
        return real(a, b)
    monkeypatch.setattr(guard_module.hmac, "compare_digest", spy)
    request(guard, "/invocations", "POST", bearer("x"))
    request(guard, "/invocations", "POST", [(b"authorization", b"Basic abc")])
    # digests of equal length, compared even when the scheme is wrong (no early exit)
    assert calls == [(32, 32), (32, 32)]


def test_the_root_path_is_stripped_as_vllm_does(guard, app):
    assert request(guard, "/api/health", "GET", root_path="/api")[0] == 200
    assert request(guard, "/api/invocations", "POST", root_path="/api")[0] == 401


def test_a_websocket_without_the_key_is_closed_before_it_is_accepted(guard, app):
    assert request(guard, "/v1/realtime", kind="websocket")[0] == 1008
    assert app.calls == []
    request(guard, "/v1/realtime", kind="websocket", headers=bearer())
    assert len(app.calls) == 1


def test_lifespan_passes(guard, app):
    async def receive():
        return {"type": "lifespan.startup"}

    async def send(_message):
        return None
    asyncio.run(guard({"type": "lifespan"}, receive, send))
    assert [c["type"] for c in app.calls] == ["lifespan"]


@pytest.mark.parametrize("value", [None, ""])
def test_no_key_refuses_to_start(app, monkeypatch, value):
    if value is None:
        monkeypatch.delenv("VLLM_API_KEY", raising=False)
    else:
        monkeypatch.setenv("VLLM_API_KEY", value)
    with pytest.raises(RuntimeError, match="VLLM_API_KEY is empty or unset, refusing to serve"):
        EngineGuard(app)


def test_open_paths_come_from_the_environment(app, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    monkeypatch.setenv("KVCACHE_GUARD_OPEN_PATHS", "/health  /ping")
    guard = EngineGuard(app)
    assert request(guard, "/ping", "GET")[0] == 200
    assert request(guard, "/metrics", "GET")[0] == 401
    monkeypatch.setenv("KVCACHE_GUARD_OPEN_PATHS", "")
    assert request(EngineGuard(app), "/health", "GET")[0] == 401


def test_an_open_path_that_is_not_a_path_refuses_to_start(app, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    monkeypatch.setenv("KVCACHE_GUARD_OPEN_PATHS", "/health metrics")
    with pytest.raises(RuntimeError, match="'metrics'"):
        EngineGuard(app)


def test_the_key_never_appears_in_an_answer_or_an_error(guard, app, monkeypatch):
    status, body = request(guard, "/invocations", "POST", bearer("wrong"))
    assert KEY.encode() not in body
    monkeypatch.setenv("VLLM_API_KEY", "")
    with pytest.raises(RuntimeError) as err:
        EngineGuard(app)
    assert KEY not in str(err.value)
