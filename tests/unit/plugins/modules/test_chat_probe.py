from __future__ import annotations

import json
import time

from ansible_collections.kvcache.offload.plugins.modules import chat_probe


def args(fake, **kw):
    base = {"base_url": fake.base_url + "/", "model": "tiny", "api_key": "sekrit-key", "prefix_tokens": 512,
            "seed": "s1", "rounds": 3, "timeout": 5}
    base.update(kw)
    return base


def test_three_rounds_same_prefix_ttft_drops(run_module, fake_openai):
    # A wide margin: under make test the check's gates and the GPU contract's venv build share
    # two cores, and a warm round (the double answers at once) measured 0.51 s there.
    fake_openai.cold_delay = 2.0
    result, failed = run_module(chat_probe, args(fake_openai))
    assert not failed, result.get("msg")
    assert result["changed"] is False
    assert result["url"] == fake_openai.base_url + "/v1/chat/completions"
    assert [r["round"] for r in result["rounds"]] == [0, 1, 2]
    assert all(r["ok"] and r["status"] == 200 for r in result["rounds"])
    # what the server received: one prefix, three suffixes, streaming, with the key
    sent = [r["body"] for r in fake_openai.requests]
    assert len(sent) == 3
    assert len(set(b["messages"][0]["content"] for b in sent)) == 1
    assert len(set(b["messages"][1]["content"] for b in sent)) == 3
    assert all(b["stream"] is True and b["model"] == "tiny" for b in sent)
    assert all(r["authorization_ok"] for r in fake_openai.requests)
    assert result["prefix"]["chars"] == len(sent[0]["messages"][0]["content"])
    # the double answers a seen prefix fast: the probe measures it
    s = result["summary"]
    assert s["ok_rounds"] == 3
    assert s["ttft_first"] >= fake_openai.cold_delay
    assert s["ttft_rest_median"] < fake_openai.cold_delay
    assert s["ttft_rest_min"] <= s["ttft_rest_median"] < s["ttft_first"]
    assert s["speedup"] > 1.5
    assert [r["cached_tokens"] for r in result["rounds"]] == [0, 2048, 2048]
    assert result["rounds"][0]["backend"]["value"] == "http://backend-1.test:8000"
    assert result["error"] is None
    assert "sekrit-key" not in json.dumps(result)


def test_prefix_is_identical_across_hosts_for_a_seed(run_module, fake_openai):
    first = run_module(chat_probe, args(fake_openai, rounds=1))[0]
    second = run_module(chat_probe, args(fake_openai, rounds=1))[0]
    other = run_module(chat_probe, args(fake_openai, rounds=1, seed="s2"))[0]
    assert first["prefix"]["sha256"] == second["prefix"]["sha256"] != other["prefix"]["sha256"]


def test_missing_key_401_expected(run_module, fake_openai):
    a = args(fake_openai, rounds=1, expect_status=401)
    del a["api_key"]
    result, failed = run_module(chat_probe, a)
    assert not failed, result.get("msg")
    assert result["status"] == 401
    assert result["rounds"][0]["error"]["body"] == "Unauthorized"
    assert fake_openai.requests[0]["has_authorization"] is False


def test_wrong_key_fails_with_structured_error(run_module, fake_openai):
    result, failed = run_module(chat_probe, args(fake_openai, api_key="wrong-one-123"))
    assert failed
    assert result["status"] == 401
    assert result["error"]["kind"] == "http"
    assert result["error"]["status"] == 401
    assert "expected HTTP 200" in result["msg"] and "Unauthorized" in result["msg"]
    assert len(result["rounds"]) == 1  # stops at the first failed round
    assert "wrong-one-123" not in json.dumps(result)


def test_200_expected_but_401_wanted_fails(run_module, fake_openai):
    result, failed = run_module(chat_probe, args(fake_openai, rounds=1, expect_status=401))
    assert failed
    assert result["status"] == 200


def test_connection_refused(run_module, closed_port):
    result, failed = run_module(chat_probe, {"base_url": "http://127.0.0.1:%d" % closed_port, "model": "m", "timeout": 2})
    assert failed
    assert result["status"] is None
    assert result["error"]["kind"] == "connection"


def test_timeout_fails_fast(run_module, fake_openai):
    fake_openai.mode = "hang_after_headers"
    started = time.monotonic()
    result, failed = run_module(chat_probe, args(fake_openai, timeout=0.5))
    assert failed
    assert result["error"]["kind"] == "timeout"
    assert time.monotonic() - started < 3


def test_check_mode_sends_nothing(run_module, fake_openai):
    result, failed = run_module(chat_probe, args(fake_openai), check_mode=True)
    assert not failed
    assert result["rounds"] == []
    assert result["prefix"]["approx_tokens"] >= 512
    assert fake_openai.requests == []


def test_bad_numbers_fail(run_module, fake_openai):
    result, failed = run_module(chat_probe, args(fake_openai, rounds=0))
    assert failed and "rounds" in result["msg"]
    assert fake_openai.requests == []
