# -*- coding: utf-8 -*-
# Copyright: kvcache.offload contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Streaming chat-completion probe: a long deterministic shared prefix plus a varying suffix.

Time to first token (TTFT) is measured from just before the request is sent to the first
SSE event that carries generated text; ``first_event`` is the first SSE event of any kind.
"""

from __future__ import annotations

import hashlib
import json
import random
import statistics
import time

from ansible_collections.kvcache.offload.plugins.module_utils.http_client import (
    HttpError,
    KIND_HTTP,
    KIND_PROTOCOL,
    iter_sse,
    open_request,
)

# Rough size of a token for English-like text with a BPE tokenizer. The prefix length is
# an estimate; what matters is that it spans many LMCache chunks (default 256 tokens).
CHARS_PER_TOKEN = 4

_WORDS = (
    "storage", "cache", "tensor", "prefix", "token", "volume", "bucket", "object", "server", "cluster",
    "request", "router", "instance", "memory", "layer", "block", "chunk", "offload", "network", "latency",
    "throughput", "replica", "shard", "queue", "kernel", "driver", "mount", "export", "policy", "lifecycle",
    "model", "weight", "attention", "decode", "prefill", "batch", "stream", "metric", "counter", "report",
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
    "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango",
)

DEFAULT_BACKEND_HEADERS = ("x-backend-url", "x-served-by", "x-upstream", "x-vllm-backend", "x-server")


def make_prefix(seed, target_tokens):
    """A deterministic text of about target_tokens tokens, different for every seed.

    The same (seed, target_tokens) gives the same text on every host and every run, so two
    instances see an identical token prefix.
    """
    rng = random.Random("kvcache.offload-prefix-%s" % seed)
    target_chars = max(1, int(target_tokens)) * CHARS_PER_TOKEN
    parts = ["Reference document %s. Read it carefully; questions follow.\n" % seed]
    length = len(parts[0])
    sentence = 0
    while length < target_chars:
        sentence += 1
        words = [rng.choice(_WORDS) for _i in range(rng.randint(8, 16))]
        text = "%d. %s %s.\n" % (sentence, words[0].capitalize(), " ".join(words[1:]))
        parts.append(text)
        length += len(text)
    return "".join(parts)


def make_suffix(round_index, run_id=""):
    tag = ("%s-%d" % (run_id, round_index)) if run_id else str(round_index)
    return "Question %s: in one short sentence, what is paragraph %d about?" % (tag, round_index + 1)


def build_body(model, prefix, suffix, max_tokens=8, temperature=0.0, include_usage=True, extra_body=None):
    body = {
        "model": model,
        "messages": [
            {"role": "system", "content": prefix},
            {"role": "user", "content": suffix},
        ],
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": temperature,
    }
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    for key, value in (extra_body or {}).items():
        body[key] = value
    return body


def _delta_text(chunk):
    """Generated text carried by one chat.completion.chunk (content or reasoning)."""
    text = ""
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        for key in ("content", "reasoning_content", "reasoning"):
            value = delta.get(key)
            if isinstance(value, str):
                text += value
        if isinstance(choice.get("text"), str):
            text += choice["text"]
    return text


def _backend(headers, backend_headers):
    for name in backend_headers or ():
        value = headers.get(name.lower())
        if value:
            return {"header": name.lower(), "value": value}
    return None


def _error_body(resp, limit=2048):
    try:
        raw = resp.read(limit=65536)
    except HttpError:
        return None
    text = raw.decode("utf-8", errors="replace")[:limit]
    try:
        data = json.loads(text)
        if isinstance(data, dict):
            err = data.get("error", data)
            if isinstance(err, dict):
                return err.get("message") or json.dumps(err)[:limit]
            return str(err)[:limit]
    except ValueError:
        pass
    return text


def run_round(url, body, api_key=None, headers=None, timeout=30.0, deadline=None,
              validate_certs=True, ca_path=None, backend_headers=DEFAULT_BACKEND_HEADERS):
    """Send one streaming request and measure it. Never raises for network errors: returns a dict."""
    result = {
        "status": None,
        "ok": False,
        "ttft": None,
        "first_event": None,
        "total": None,
        "events": 0,
        "text_chars": 0,
        "finish_reason": None,
        "usage": None,
        "cached_tokens": None,
        "backend": None,
        "response_id": None,
        "error": None,
    }
    started = time.monotonic()
    try:
        resp = open_request(url, method="POST", body=body, headers=headers, timeout=timeout, deadline=deadline,
                            validate_certs=validate_certs, ca_path=ca_path, api_key=api_key, accept="text/event-stream")
    except HttpError as exc:
        result["error"] = exc.to_dict()
        result["total"] = time.monotonic() - started
        return result
    with resp:
        result["status"] = resp.status
        result["backend"] = _backend(resp.headers, backend_headers)
        if resp.status != 200:
            result["error"] = HttpError(KIND_HTTP, "HTTP %s" % resp.status, url=url, status=resp.status,
                                        body=_error_body(resp), elapsed=resp.elapsed()).to_dict()
            result["total"] = resp.elapsed()
            return result
        done = False
        try:
            for elapsed, data in iter_sse(resp):
                if data.strip() == "[DONE]":
                    done = True
                    break
                result["events"] += 1
                if result["first_event"] is None:
                    result["first_event"] = elapsed
                try:
                    chunk = json.loads(data)
                except ValueError:
                    raise HttpError(KIND_PROTOCOL, "an SSE event is not JSON", url=url, status=resp.status, elapsed=elapsed)
                if not isinstance(chunk, dict):
                    continue
                if "error" in chunk:
                    err = chunk["error"]
                    raise HttpError(KIND_PROTOCOL, "error in stream: %s" % (err.get("message") if isinstance(err, dict) else err),
                                    url=url, status=resp.status, elapsed=elapsed)
                if result["response_id"] is None and chunk.get("id"):
                    result["response_id"] = chunk.get("id")
                text = _delta_text(chunk)
                if text:
                    result["text_chars"] += len(text)
                    if result["ttft"] is None:
                        result["ttft"] = elapsed
                for choice in chunk.get("choices") or []:
                    if choice.get("finish_reason"):
                        result["finish_reason"] = choice["finish_reason"]
                if chunk.get("usage"):
                    usage = chunk["usage"]
                    result["usage"] = usage
                    details = usage.get("prompt_tokens_details") or {}
                    if isinstance(details, dict) and details.get("cached_tokens") is not None:
                        result["cached_tokens"] = details.get("cached_tokens")
        except HttpError as exc:
            result["error"] = exc.to_dict()
            result["total"] = resp.elapsed()
            return result
        result["total"] = resp.elapsed()
        if not done:
            result["error"] = HttpError(KIND_PROTOCOL, "stream ended without [DONE]", url=url, status=resp.status,
                                        elapsed=result["total"]).to_dict()
            return result
        if result["ttft"] is None:
            # A model may legitimately produce an empty first token; fall back to the first event.
            result["ttft"] = result["first_event"]
        result["ok"] = True
    return result


def summarize(rounds):
    """TTFT of the first round vs the later rounds (the cache-hit rounds)."""
    ok = [r for r in rounds if r.get("ok") and r.get("ttft") is not None]
    out = {
        "rounds": len(rounds),
        "ok_rounds": len(ok),
        "ttft_first": rounds[0].get("ttft") if rounds and rounds[0].get("ok") else None,
        "ttft_rest_median": None,
        "ttft_rest_min": None,
        "ttft_median": None,
        "total_median": None,
        "speedup": None,
    }
    if ok:
        out["ttft_median"] = statistics.median([r["ttft"] for r in ok])
        out["total_median"] = statistics.median([r["total"] for r in ok])
    rest = [r["ttft"] for r in rounds[1:] if r.get("ok") and r.get("ttft") is not None]
    if rest:
        out["ttft_rest_median"] = statistics.median(rest)
        out["ttft_rest_min"] = min(rest)
        if out["ttft_first"] and out["ttft_rest_median"]:
            out["speedup"] = out["ttft_first"] / out["ttft_rest_median"]
    return out


def prefix_info(prefix, seed, target_tokens):
    return {
        "seed": seed,
        "target_tokens": target_tokens,
        "chars": len(prefix),
        "approx_tokens": len(prefix) // CHARS_PER_TOKEN,
        "sha256": hashlib.sha256(prefix.encode("utf-8")).hexdigest(),
    }
