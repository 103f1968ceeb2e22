# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab section of scripts/bench.py: TTFT cold / same-instance hit / cross-instance hit
through LMCache's multiprocess servers for prompts of 512-8192 tokens, medians of N rounds,
on each of the lab's tiers (fs: the shared volume; s3: SeaweedFS), on the running lab
(skipped when it is down). A tier other than the one the lab runs is reached by converging
playbooks/nodes.yml with -e kvcache_tier=<tier> (the rolling restart of the servers), and the
lab is converged back afterwards. Talks to the lab's instances with the collection's own
chat, http_client and prom module_utils; reads the LMCache server's loopback /metrics inside
node2's container (docker exec), so the cross-instance column says how many tokens LMCache
itself loaded from its L2.
"""

import json
import os
import random
import secrets
import ssl
import statistics
import subprocess
import sys
import time
import urllib.request

import yaml

from bench_common import ROOT, _f, log, ratio

# The lab's engines serve TLS when its inventory says so (kvcache_engine_tls), verified against
# the lab CA (LAB SUBSTITUTE, playbooks/lab_up.yml).
LAB_CA_FILE = os.path.join(ROOT, "build", "lab", "tls", "ca.crt")


def _engine_scheme():
    path = os.path.join(ROOT, "inventories", "lab", "group_vars", "all", "lab_tls.yml")
    try:
        with open(path, encoding="utf-8") as handle:
            return "https" if (yaml.safe_load(handle) or {}).get("kvcache_engine_tls") is True else "http"
    except OSError:
        return "http"


SCHEME = _engine_scheme()
CA_PATH = LAB_CA_FILE if SCHEME == "https" else None
LAB_NODES = (("kvcache-lab-node1", SCHEME + "://172.29.100.11:8000"), ("kvcache-lab-node2", SCHEME + "://172.29.100.12:8000"))


def _context():
    return ssl.create_default_context(cafile=CA_PATH) if CA_PATH else None


# The LMCache server's HTTP port on every lab node (lmcache_mp_http_port, loopback only).
LMCACHE_METRICS_URL = "http://127.0.0.1:8080/metrics"
# Room the prompt leaves in the context for the chat template and the one answer token.
CONTEXT_MARGIN = 64
# Read by docker exec inside the node (the server listens on the node's loopback only).
_FETCH = ("import sys, urllib.request\n"
          "with urllib.request.urlopen(sys.argv[1], timeout=10) as r:\n"
          "    sys.stdout.write(r.read(16 << 20).decode('utf-8', 'replace'))\n")


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
            with urllib.request.urlopen(url + "/health", timeout=timeout, context=_context()) as resp:
                if resp.status != 200:
                    return False, "%s/health answered %s" % (url, resp.status), None, []
        except Exception as exc:  # pylint: disable=broad-except
            return False, "%s/health: %s" % (url, exc), None, []
    return True, "", api_key, [url for _name, url in LAB_NODES]


def _served_model(http_client, url, api_key):
    """(served model name, max_model_len or None) from /v1/models."""
    resp = http_client.open_request(url + "/v1/models", api_key=api_key, timeout=10, deadline=20, ca_path=CA_PATH)
    with resp:
        data = json.loads(resp.read(limit=1 << 20).decode())
    return data["data"][0]["id"], data["data"][0].get("max_model_len")


def prompt_target(size, max_model_len):
    """The prompt tokens asked for a target size: the size, clipped to what the context holds."""
    if not max_model_len:
        return size
    return max(1, min(size, int(max_model_len) - CONTEXT_MARGIN))


def _lmcache_l2_hits(prom, container):
    """Tokens the LMCache server in `container` has found in its L2 so far (None when unreadable)."""
    try:
        proc = subprocess.run(["docker", "exec", container, "python3", "-c", _FETCH, LMCACHE_METRICS_URL],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    summary = prom.snapshot(proc.stdout.decode("utf-8", "replace"), prefixes=("lmcache_mp_",))["summary"]
    return summary.get("lmcache_mp_lookup_hit_l2_tokens")


def lab_tier():
    """The tier the lab inventory converges (kvcache_tier of the nodes), 'fs' when unset."""
    proc = subprocess.run(["ansible-inventory", "--host", "lab-node1"], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, timeout=120, check=False)
    try:
        return json.loads(proc.stdout.decode()).get("kvcache_tier") or "fs"
    except ValueError:
        return "fs"


def converge_tier(tier, timeout=1500):
    """playbooks/nodes.yml with -e kvcache_tier=<tier> (None: the inventory's own); (rc, seconds, tail)."""
    cmd = ["ansible-playbook", "playbooks/nodes.yml"] + (["-e", "kvcache_tier=%s" % tier] if tier else [])
    started = time.monotonic()
    # The environment make bench exports (PATH, ANSIBLE_CONFIG/HOME/COLLECTIONS_PATH), as every section uses.
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
    return proc.returncode, time.monotonic() - started, (proc.stdout + proc.stderr)[-2000:]


def _wait_healthy(urls, timeout=600):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        healthy = 0
        for url in urls:
            try:
                with urllib.request.urlopen(url + "/health", timeout=5, context=_context()) as resp:
                    healthy += resp.status == 200
            except Exception:  # pylint: disable=broad-except
                pass
        if healthy == len(urls):
            return True
        time.sleep(3)
    return False


def _by_source(http_client, prom, url):
    """{source: tokens} of vllm:prompt_tokens_by_source on one instance's /metrics ({} on error)."""
    try:
        resp = http_client.open_request(url + "/metrics", timeout=10, deadline=20, accept="text/plain", ca_path=CA_PATH)
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


TARGET_CHECK = "cross-instance hit at 2k tokens <= 0.5 x cold"


def measure_tier(args, libs, model, max_model_len, urls, api_key, deadline):
    """TTFT rows per size on the tier the lab serves now: {"results": [...], "notes": [...], ...}."""
    chat, http_client, prom = libs
    node1, node2 = urls
    node2_container = LAB_NODES[1][0]
    run_id = "b" + secrets.token_hex(3)
    out = {"results": [], "notes": []}

    def ask(url, text, tag):
        body = chat.build_body(model, text, "Answer %s in one word." % tag, max_tokens=1, temperature=0.0)
        return chat.run_round(url + "/v1/chat/completions", body, api_key=api_key, timeout=120, deadline=180,
                              ca_path=CA_PATH)

    # calibrate words per token with one request (the tiny model's tokenizer is trained locally)
    probe = ask(node1, make_words(run_id + "-cal", 400), "calibrate")
    tokens = (probe.get("usage") or {}).get("prompt_tokens")
    words_per_token = 400.0 / tokens if probe.get("ok") and tokens else 1.0
    out["words_per_token"] = words_per_token
    engine_failed = None
    for size in args.sizes:
        if engine_failed:
            break
        asked = prompt_target(size, max_model_len)
        if asked < size:
            out["notes"].append("%d tokens: the prompt is clipped to %d (max_model_len %s)" % (size, asked, max_model_len))
        rows = []
        for rnd in range(args.rounds):
            if engine_failed:
                break
            if time.monotonic() > deadline:
                out["notes"].append("stopped at the time limit (%ss)" % args.lab_max_seconds)
                break
            # the template adds tokens of its own: aim a little below the target
            text = make_words("%s-%d-%d" % (run_id, size, rnd), max(1, asked - 24) * words_per_token)
            tag = "%s-%d-%d" % (run_id, size, rnd)
            before = _by_source(http_client, prom, node2)
            l2_before = _lmcache_l2_hits(prom, node2_container)
            cold = ask(node1, text, tag)          # computes; LMCache stores its chunks in the tier
            cross = ask(node2, text, tag)         # other instance: its LMCache server loads from the tier
            after = _by_source(http_client, prom, node2)
            l2_after = _lmcache_l2_hits(prom, node2_container)
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
                "cross_lmcache_l2_tokens": (l2_after - l2_before)
                if l2_after is not None and l2_before is not None else None,
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
            "cross_lmcache_l2_tokens_median": med("cross_lmcache_l2_tokens"),
            "rows": rows,
        }
        out["results"].append(result)
        log("lab: %d tokens: cold %s, same %s, cross %s (LMCache L2 %s tokens)"
            % (size, result["ttft_cold_median_s"], result["ttft_same_median_s"], result["ttft_cross_median_s"],
               result["cross_lmcache_l2_tokens_median"]))
    if engine_failed:
        out["engine_failed"] = engine_failed
        out["notes"].append("STOPPED: an instance's engine failed (%s); the remaining sizes were not run. "
                            "Look at `journalctl -u 'kvcache-vllm@*'` on the node." % engine_failed)
    out["target"] = target_check(out["results"])
    return out


def target_check(results):
    """The 2k-token target of one tier: cross <= 0.5 x cold, and the cross load came from LMCache's L2."""
    row = [r for r in results if r["target_tokens"] == 2048]
    if not row or row[0]["cross_over_cold"] is None:
        return {"check": TARGET_CHECK, "value": None, "pass": None}
    value = row[0]["cross_over_cold"]
    loaded = row[0].get("cross_lmcache_l2_tokens_median")
    verdict = value <= 0.5 and bool(loaded)
    return {"check": TARGET_CHECK, "value": value, "lmcache_l2_tokens": loaded, "pass": verdict}


def section_lab(args, out_dir, record):
    up, reason, api_key, urls = lab_status()
    if not up:
        log("lab: skipped (%s)" % reason)
        return {"skipped": True, "reason": reason}
    libs = _lab_libs()
    model, max_model_len = _served_model(libs[1], urls[0], api_key)
    home = lab_tier()
    section = {"skipped": False, "model": model, "max_model_len": max_model_len, "nodes": urls,
               "rounds": args.rounds, "sizes": args.sizes, "lab_tier": home,
               "connector": "LMCache multiprocess mode (one lmcache server per node, the tier as its L2)",
               "tiers": [], "notes": []}
    switched = False
    try:
        for tier in args.lab_tiers:
            entry = {"tier": tier}
            if tier != home:
                log("lab: converging the nodes onto the %s tier" % tier)
                rc, seconds, tail = converge_tier(tier)
                switched = True
                entry["converge_s"] = round(seconds, 1)
                if rc != 0 or not _wait_healthy(urls):
                    entry.update({"error": "playbooks/nodes.yml -e kvcache_tier=%s failed (rc %s) or an instance "
                                           "did not answer: %s" % (tier, rc, tail[-600:]),
                                  "results": [], "target": {"check": TARGET_CHECK, "value": None, "pass": None}})
                    section["tiers"].append(entry)
                    continue
            deadline = time.monotonic() + args.lab_max_seconds  # per tier
            entry.update(measure_tier(args, libs, model, max_model_len, urls, api_key, deadline))
            section["tiers"].append(entry)
            if entry.get("engine_failed"):
                break
    finally:
        if switched:
            log("lab: converging the nodes back onto the lab's %s tier" % home)
            rc, _seconds, tail = converge_tier(None)
            section["lab_tier_restored"] = rc == 0 and _wait_healthy(urls)
            if not section["lab_tier_restored"]:
                section["notes"].append("restoring the lab's %s tier failed (rc %s): %s" % (home, rc, tail[-400:]))
    verdicts = [t["target"]["pass"] for t in section["tiers"]]
    section["target"] = {"check": TARGET_CHECK + " on every tier",
                         "pass": None if not verdicts or None in verdicts else all(verdicts),
                         "by_tier": dict((t["tier"], t["target"]["value"]) for t in section["tiers"])}
    return section


def render_markdown(lab):
    """The lab section of bench.md (a list of lines)."""
    lines = ["## Lab tier effectiveness (TTFT through LMCache)", ""]
    if lab.get("skipped"):
        return lines + ["Skipped: %s." % lab.get("reason"), ""]
    lines.append("Model `%s` (max_model_len %s), %s; medians of %d rounds; each round a new prompt: cold on node1, "
                 "then the same prompt on node2 (cross-instance: node2's LMCache server loads node1's chunks from "
                 "the tier), then again on node1 (same instance: vLLM's own prefix cache). Prompt sizes are real "
                 "`usage.prompt_tokens`; LMCache L2 tokens are node2's server's `lmcache_mp_lookup_hit_l2_tokens` "
                 "growth around the cross-instance request." % (
                     lab["model"], lab.get("max_model_len"), lab["connector"], lab["rounds"]))
    lines.append("")
    for tier in lab.get("tiers", []):
        lines.append("### %s tier%s" % (tier["tier"], " (the lab's own)" if tier["tier"] == lab.get("lab_tier") else
                                        " (converged for the bench, %s s)" % tier.get("converge_s")))
        lines.append("")
        if tier.get("error"):
            lines += ["Not measured: %s" % tier["error"], ""]
            continue
        lines.append("| target tokens | real tokens | cold ms | same-instance ms | cross-instance ms | cross / cold "
                     "| same / cold | external tokens (node2) | LMCache L2 tokens (node2) |")
        lines.append("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in tier["results"]:
            lines.append("| %d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                r["target_tokens"], _f(r["prompt_tokens_median"], "%.0f"),
                _f(r["ttft_cold_median_s"] and r["ttft_cold_median_s"] * 1000),
                _f(r["ttft_same_median_s"] and r["ttft_same_median_s"] * 1000),
                _f(r["ttft_cross_median_s"] and r["ttft_cross_median_s"] * 1000),
                _f(r["cross_over_cold"], "%.2f"), _f(r["same_over_cold"], "%.2f"),
                _f(r["cross_external_tokens_median"], "%.0f"), _f(r.get("cross_lmcache_l2_tokens_median"), "%.0f")))
        target = tier.get("target", {})
        verdict = {True: "PASS", False: "FAIL", None: "not measured"}[target.get("pass")]
        lines += ["", "Target (%s): **%s** (%s)." % (target.get("check"), verdict, _f(target.get("value"), "%.2f")), ""]
        for note in tier.get("notes", []):
            lines.append("- %s" % note)
        lines.append("")
    for note in lab.get("notes", []):
        lines.append("- %s" % note)
    if lab.get("notes"):
        lines.append("")
    return lines
