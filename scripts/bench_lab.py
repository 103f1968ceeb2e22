# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab section of scripts/bench.py: TTFT cold / same-instance hit / cross-instance hit via
the shared tier for prompts of 512-4096 tokens, medians of N rounds, on the running lab
(skipped when it is down). Talks to the lab's instances with the collection's own chat,
http_client and prom module_utils.
"""

import json
import os
import random
import secrets
import statistics
import subprocess
import sys
import time
import urllib.request

from bench_common import ROOT, _f, log, ratio

LAB_NODES = (("kvcache-lab-node1", "http://172.29.100.11:8000"), ("kvcache-lab-node2", "http://172.29.100.12:8000"))


def _lab_libs():
    sys.path.insert(0, os.path.join(ROOT, "build", "collections"))
    link = os.path.join(ROOT, "build", "collections", "ansible_collections", "kvcache", "offload")
    if not os.path.lexists(link):
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(os.path.join("..", "..", "..", ".."), link)
    from ansible_collections.kvcache.offload.plugins.module_utils import chat, http_client, prom
    return chat, http_client, prom


def lab_status(timeout=5):
    """(up, reason, api_key, nodes). Up when both node containers run and /health answers 200."""
    try:
        proc = subprocess.run(["docker", "ps", "--format", "{{.Names}}"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, timeout=20, check=False)
        names = set(proc.stdout.decode().split())
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, "docker ps failed: %s" % exc, None, []
    missing = [name for name, _url in LAB_NODES if name not in names]
    if missing:
        return False, "lab containers not running: %s" % ", ".join(missing), None, []
    key_file = os.path.join(ROOT, "build", "lab", "secrets", "api-key")
    try:
        with open(key_file) as handle:
            api_key = handle.read().strip()
    except OSError as exc:
        return False, "cannot read the lab API key: %s" % exc, None, []
    for _name, url in LAB_NODES:
        try:
            with urllib.request.urlopen(url + "/health", timeout=timeout) as resp:
                if resp.status != 200:
                    return False, "%s/health answered %s" % (url, resp.status), None, []
        except Exception as exc:  # pylint: disable=broad-except
            return False, "%s/health: %s" % (url, exc), None, []
    return True, "", api_key, [url for _name, url in LAB_NODES]


def _served_model(http_client, url, api_key):
    resp = http_client.open_request(url + "/v1/models", api_key=api_key, timeout=10, deadline=20)
    with resp:
        data = json.loads(resp.read(limit=1 << 20).decode())
    return data["data"][0]["id"]


def _by_source(http_client, prom, url):
    """{source: tokens} of vllm:prompt_tokens_by_source on one instance's /metrics ({} on error)."""
    try:
        resp = http_client.open_request(url + "/metrics", timeout=10, deadline=20, accept="text/plain")
        with resp:
            text = resp.read(limit=16 << 20).decode("utf-8", errors="replace")
        return prom.snapshot(text)["summary"].get("prompt_tokens_by_source") or {}
    except Exception:  # pylint: disable=broad-except
        return {}


def make_words(seed, count):
    """count deterministic words, different for every seed."""
    rng = random.Random("kvcache.offload-bench-%s" % seed)
    vocab = ("storage cache tensor prefix token volume bucket object server cluster request router instance "
             "memory layer block chunk offload network latency throughput replica shard queue kernel driver "
             "mount export policy lifecycle model weight attention decode prefill batch stream metric").split()
    return " ".join(rng.choice(vocab) for _i in range(max(1, int(count))))


def section_lab(args, out_dir, record):
    up, reason, api_key, urls = lab_status()
    if not up:
        log("lab: skipped (%s)" % reason)
        return {"skipped": True, "reason": reason}
    chat, http_client, prom = _lab_libs()
    node1, node2 = urls
    model = _served_model(http_client, node1, api_key)
    run_id = "b" + secrets.token_hex(3)
    deadline = time.monotonic() + args.lab_max_seconds
    section = {"skipped": False, "model": model, "nodes": urls, "rounds": args.rounds, "sizes": args.sizes,
               "connector": "lab: LMCache multiprocess mode (one lmcache server per node, the shared volume as its L2)",
               "results": [], "notes": []}

    def ask(url, text, tag):
        body = chat.build_body(model, text, "Answer %s in one word." % tag, max_tokens=1, temperature=0.0)
        return chat.run_round(url + "/v1/chat/completions", body, api_key=api_key, timeout=120, deadline=180)

    # calibrate words per token with one request (the tiny model's tokenizer is trained locally)
    probe = ask(node1, make_words(run_id + "-cal", 400), "calibrate")
    tokens = (probe.get("usage") or {}).get("prompt_tokens")
    words_per_token = 400.0 / tokens if probe.get("ok") and tokens else 1.0
    section["words_per_token"] = words_per_token
    engine_failed = None
    for size in args.sizes:
        if engine_failed:
            break
        rows = []
        for rnd in range(args.rounds):
            if engine_failed:
                break
            if time.monotonic() > deadline:
                section["notes"].append("stopped at the time limit (%ss)" % args.lab_max_seconds)
                break
            text = make_words("%s-%d-%d" % (run_id, size, rnd), size * words_per_token)
            tag = "%s-%d-%d" % (run_id, size, rnd)
            before = _by_source(http_client, prom, node2)
            cold = ask(node1, text, tag)          # computes; the connector saves to the shared tier
            cross = ask(node2, text, tag)         # other instance: loads from the shared tier
            after = _by_source(http_client, prom, node2)
            same = ask(node1, text, tag)          # same instance: its own prefix cache
            rows.append({
                "round": rnd,
                "prompt_tokens": (cold.get("usage") or {}).get("prompt_tokens"),
                "cold": cold.get("ttft") if cold.get("ok") else None,
                "same": same.get("ttft") if same.get("ok") else None,
                "cross": cross.get("ttft") if cross.get("ok") else None,
                "same_cached_tokens": same.get("cached_tokens"),
                "cross_external_tokens": (after.get("external_kv_transfer", 0.0) - before.get("external_kv_transfer", 0.0))
                if after and before else None,
                "errors": [r.get("error") for r in (cold, cross, same) if not r.get("ok")],
            })
            for name, resp in (("node1", cold), ("node2", cross), ("node1", same)):
                err = resp.get("error") or {}
                if (err.get("status") or 0) >= 500 or "EngineCore" in str(err.get("message")):
                    # A dead engine stays dead (or restarts for a minute): stop instead of hammering it.
                    engine_failed = "%s failed at %d tokens: %s" % (name, size, err.get("message"))

        def med(key):
            values = [r[key] for r in rows if r.get(key) is not None]
            return statistics.median(values) if values else None
        result = {
            "target_tokens": size, "rounds_done": len(rows),
            "prompt_tokens_median": med("prompt_tokens"),
            "ttft_cold_median_s": med("cold"), "ttft_same_median_s": med("same"), "ttft_cross_median_s": med("cross"),
            "cross_over_cold": ratio(med("cross"), med("cold")),
            "same_over_cold": ratio(med("same"), med("cold")),
            "cross_external_tokens_median": med("cross_external_tokens"),
            "rows": rows,
        }
        section["results"].append(result)
        log("lab: %d tokens: cold %s, same %s, cross %s"
            % (size, result["ttft_cold_median_s"], result["ttft_same_median_s"], result["ttft_cross_median_s"]))
    if engine_failed:
        section["engine_failed"] = engine_failed
        section["notes"].append("STOPPED: an instance's engine failed (%s); the remaining sizes were not run. "
                                "Look at `journalctl -u 'kvcache-vllm@*'` on the node." % engine_failed)
    target = [r for r in section["results"] if r["target_tokens"] == 2048]
    if target and target[0]["cross_over_cold"] is not None:
        section["target"] = {"check": "cross-instance hit at 2k tokens <= 0.5 x cold",
                             "value": target[0]["cross_over_cold"], "pass": target[0]["cross_over_cold"] <= 0.5}
    else:
        section["target"] = {"check": "cross-instance hit at 2k tokens <= 0.5 x cold", "value": None, "pass": None}
    return section


def render_markdown(lab):
    """The lab section of bench.md (a list of lines)."""
    lines = ["## Lab tier effectiveness (TTFT)", ""]
    if lab.get("skipped"):
        lines += ["Skipped: %s." % lab.get("reason"), ""]
    else:
        lines.append("Model `%s`, %s; medians of %d rounds; each round a new prompt: cold on node1, "
                     "then the same prompt on node2 (cross-instance, via the shared tier), then again on node1 "
                     "(same instance). Prompt sizes are real `usage.prompt_tokens`." % (lab["model"], lab["connector"], lab["rounds"]))
        lines.append("")
        lines.append("| target tokens | real tokens | cold ms | same-instance ms | cross-instance ms | cross / cold "
                     "| same / cold | external tokens (node2) |")
        lines.append("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in lab["results"]:
            lines.append("| %d | %s | %s | %s | %s | %s | %s | %s |" % (
                r["target_tokens"], _f(r["prompt_tokens_median"], "%.0f"),
                _f(r["ttft_cold_median_s"] and r["ttft_cold_median_s"] * 1000),
                _f(r["ttft_same_median_s"] and r["ttft_same_median_s"] * 1000),
                _f(r["ttft_cross_median_s"] and r["ttft_cross_median_s"] * 1000),
                _f(r["cross_over_cold"], "%.2f"), _f(r["same_over_cold"], "%.2f"),
                _f(r["cross_external_tokens_median"], "%.0f")))
        target = lab.get("target", {})
        verdict = {True: "PASS", False: "FAIL", None: "not measured"}[target.get("pass")]
        lines += ["", "Target (%s): **%s** (%s)." % (target.get("check"), verdict, _f(target.get("value"), "%.2f")), ""]
        for note in lab.get("notes", []):
            lines.append("- %s" % note)
        lines.append("")
    return lines
