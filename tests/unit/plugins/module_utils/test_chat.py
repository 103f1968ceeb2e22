from __future__ import annotations

import time

from ansible_collections.kvcache.offload.plugins.module_utils import chat


def test_prefix_is_deterministic_and_seeded():
    a1 = chat.make_prefix("run-1", 1024)
    a2 = chat.make_prefix("run-1", 1024)
    b = chat.make_prefix("run-2", 1024)
    assert a1 == a2
    assert a1 != b
    # different seeds differ from the first characters on, so no chunk is shared by accident
    assert a1[:40] != b[:40]
    assert 1024 * chat.CHARS_PER_TOKEN <= len(a1) < 1024 * chat.CHARS_PER_TOKEN + 200
    assert chat.make_prefix("run-1", 4096).startswith(a1[:1000])


def test_suffix_varies_per_round_and_run():
    assert chat.make_suffix(0) != chat.make_suffix(1)
    assert chat.make_suffix(0, "x") != chat.make_suffix(0, "y")


def test_body_shape():
    body = chat.build_body("tiny", "P", "S", max_tokens=3)
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "system", "content": "P"}, {"role": "user", "content": "S"}]
    assert body["max_tokens"] == 3


def _url(fake):
    return fake.base_url + "/v1/chat/completions"


def test_round_ok_measures_ttft_after_prefill(fake_openai):
    body = chat.build_body("tiny", chat.make_prefix(1, 256), "q")
    res = chat.run_round(_url(fake_openai), body, api_key="sekrit-key", timeout=5)
    assert res["ok"] is True, res
    assert res["status"] == 200
    # the empty role chunk arrives before prefill; TTFT counts the first real token
    assert res["first_event"] < res["ttft"]
    assert res["ttft"] >= fake_openai.cold_delay
    assert res["total"] >= res["ttft"]
    assert res["events"] == 1 + fake_openai.tokens + 1 + 1
    assert res["text_chars"] == len("tok0 tok1 tok2 tok3 ")
    assert res["finish_reason"] == "length"
    assert res["cached_tokens"] == 0
    assert res["backend"] == {"header": "x-backend-url", "value": "http://backend-1.test:8000"}
    assert res["response_id"].startswith("chatcmpl-test-")
    assert fake_openai.requests[0]["authorization_ok"] is True
    assert fake_openai.requests[0]["headers"]["accept"] == "text/event-stream"


def test_round_401_is_structured(fake_openai):
    body = chat.build_body("tiny", "p", "q")
    res = chat.run_round(_url(fake_openai), body, api_key=None, timeout=5)
    assert res["ok"] is False
    assert res["status"] == 401
    assert res["error"]["kind"] == "http"
    assert res["error"]["status"] == 401
    assert res["error"]["body"] == "Unauthorized"
    assert fake_openai.requests[0]["has_authorization"] is False


def test_round_wrong_key_never_echoes_key(fake_openai):
    res = chat.run_round(_url(fake_openai), chat.build_body("tiny", "p", "q"), api_key="wrong-key-XYZ", timeout=5)
    assert res["status"] == 401
    assert "wrong-key-XYZ" not in repr(res)


def test_round_connection_refused(closed_port):
    res = chat.run_round("http://127.0.0.1:%d/v1/chat/completions" % closed_port, chat.build_body("m", "p", "q"), timeout=2)
    assert res["status"] is None
    assert res["error"]["kind"] == "connection"


def test_round_times_out_mid_stream(fake_openai):
    fake_openai.mode = "hang_after_headers"
    started = time.monotonic()
    res = chat.run_round(_url(fake_openai), chat.build_body("m", "p", "q"), api_key="sekrit-key", timeout=0.5, deadline=0.5)
    assert time.monotonic() - started < 3
    assert res["status"] == 200
    assert res["ok"] is False
    assert res["error"]["kind"] == "timeout"


def test_round_times_out_before_headers(fake_openai):
    fake_openai.mode = "hang_before_headers"
    res = chat.run_round(_url(fake_openai), chat.build_body("m", "p", "q"), api_key="sekrit-key", timeout=0.5)
    assert res["status"] is None
    assert res["error"]["kind"] == "timeout"


def test_round_stream_without_done_is_protocol_error(fake_openai):
    fake_openai.mode = "no_done"
    res = chat.run_round(_url(fake_openai), chat.build_body("m", "p", "q"), api_key="sekrit-key", timeout=5)
    assert res["ok"] is False
    assert res["error"]["kind"] == "protocol"
    assert "DONE" in res["error"]["message"]


def test_round_bad_json_event(fake_openai):
    fake_openai.mode = "bad_json"
    res = chat.run_round(_url(fake_openai), chat.build_body("m", "p", "q"), api_key="sekrit-key", timeout=5)
    assert res["error"]["kind"] == "protocol"


def test_summarize():
    rounds = [{"ok": True, "ttft": 0.4, "total": 0.5}, {"ok": True, "ttft": 0.1, "total": 0.2},
              {"ok": True, "ttft": 0.05, "total": 0.1}, {"ok": False, "ttft": None, "total": 1}]
    s = chat.summarize(rounds)
    assert s["ok_rounds"] == 3
    assert s["ttft_first"] == 0.4
    assert abs(s["ttft_rest_median"] - 0.075) < 1e-9
    assert s["ttft_rest_min"] == 0.05
    assert abs(s["speedup"] - 0.4 / 0.075) < 1e-9
    assert chat.summarize([])["ttft_first"] is None
