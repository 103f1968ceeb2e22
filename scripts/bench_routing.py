# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The routing section of scripts/bench.py (#22 item 3): router policies compared on the lab.

For each policy (--routing-policies, default round_robin,cache_aware) the lab's router ONLY is
reconverged with -e router_policy=<policy> (playbooks/router.yml), then the same multi-session
prompt mix is sent through it one request at a time (module_utils/routing_session, as
validation stage 8): --routing-sessions sessions with prefixes of different lengths, each a first
turn and --routing-turns repeat turns, the sessions interleaved in one seeded order that is the
same for every policy. Every request is attributed to the instance whose counters grew and its
prefix to the GPU prefix cache, the shared tier or recomputation (module_utils/routing).
Each policy's run uses its own prefix seed with the same lengths and order, so every policy
starts cold (with one seed the second policy would hit what the first one cached). At the end
the router is reconverged without the override: the lab's own policy again.
"""

import os
import subprocess
import sys
import ssl
import time
import urllib.request

from bench_common import ROOT, _f, log

# The lab router's TLS front, its CA and the client key (LAB SUBSTITUTES, playbooks/lab_up.yml and
# inventories/lab/group_vars/all/lab_tls.yml); the engines' key is for the instances only.
ROUTER_URL = "https://172.29.100.20:8001"
LAB_CA = os.path.join(ROOT, "build", "lab", "tls", "ca.crt")
CLIENT_KEY_FILE = os.path.join(ROOT, "build", "lab", "secrets", "client-api-key")
LAB_INSTANCES = (("lab-node1", "cpu0", "http://172.29.100.11:8000"), ("lab-node2", "cpu0", "http://172.29.100.12:8000"))
# Prefix lengths (estimated tokens, 4 characters each) cycled over the sessions; the lab's tiny
# model's tokenizer makes ~2.5 real tokens of each, below its one-step prefill (docs/lab.md).
PREFIX_MIX = (640, 400, 800, 520, 720, 480)


def _libs():
    sys.path.insert(0, os.path.join(ROOT, "build", "collections"))
    from ansible_collections.kvcache.offload.plugins.module_utils import routing, routing_session
    return routing, routing_session


def _healthy(url, timeout=5):
    try:
        context = ssl.create_default_context(cafile=LAB_CA) if url.startswith("https:") else None
        with urllib.request.urlopen(url + "/health", timeout=timeout, context=context) as resp:
            return resp.status == 200
    except Exception:  # pylint: disable=broad-except
        return False


def _wait(urls, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(_healthy(u) for u in urls):
            return True
        time.sleep(2)
    return False


def converge_router(policy=None, timeout=600):
    """playbooks/router.yml on the lab, with -e router_policy=<policy> unless None; (rc, seconds, tail)."""
    cmd = ["ansible-playbook", "playbooks/router.yml"] + (["-e", "router_policy=%s" % policy] if policy else [])
    started = time.monotonic()
    # The environment make bench exports (PATH, ANSIBLE_CONFIG/HOME/COLLECTIONS_PATH), as every section uses.
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
    return proc.returncode, time.monotonic() - started, (proc.stdout + proc.stderr)[-2000:]


def run_policy(policy, args, api_key, stamp):
    routing, routing_session = _libs()
    rc, seconds, tail = converge_router(policy)
    if rc != 0:
        return {"policy": policy, "error": "router.yml -e router_policy=%s failed (rc %s): %s" % (policy, rc, tail[-600:])}
    urls = [u for _h, _i, u in LAB_INSTANCES]
    if not _wait(urls + [ROUTER_URL]):
        return {"policy": policy, "error": "the router or an instance does not answer /health after the converge"}
    sizes = dict((s, PREFIX_MIX[s % len(PREFIX_MIX)]) for s in range(args.routing_sessions))
    run = routing_session.run_sessions(
        ROUTER_URL, urls, args.routing_model, sessions=args.routing_sessions, turns=args.routing_turns,
        prefix_tokens=PREFIX_MIX[0], prefix_tokens_by_session=sizes, seed="bench-%s-%s" % (stamp, policy),
        run_id="bench-%s" % stamp, max_tokens=4, api_key=api_key, timeout=120, order="shuffled", settle_retries=3,
        ca_path=LAB_CA,
        order_seed="bench-%s" % stamp)
    instances = [{"host": h, "instance": i, "url": u} for h, i, u in LAB_INSTANCES]
    nums = routing.analyse(run["requests"], instances)
    ttft_all = [r["ttft_s"] for r in nums["rows"] if r["ok"]]
    out = {"policy": policy, "router_converge_s": round(seconds, 1), "probe_s": round(run["elapsed"], 1),
           "requests": nums["requests"], "failed": nums["failed"], "unattributed": nums["unattributed"],
           "repeat_turns": nums["repeat_turns"], "repeat_on_holding_instance": nums["repeat_on_holding_instance"],
           "holding_ratio": nums["holding_ratio"], "first_repeat_holding_ratio": nums["first_repeat_holding_ratio"],
           "sources": nums["sources"], "ttft_median_s": routing.percentile(ttft_all, 50),
           "ttft_p95_s": routing.percentile(ttft_all, 95), "ttft_repeat_median_s": routing.percentile(
               [r["ttft_s"] for r in nums["rows"] if r["ok"] and r["turn"] > 0], 50),
           "ttft_repeat_p95_s": nums["ttft_repeat_p95_s"],
           "ttft_first_turn_median_s": routing.percentile([r["ttft_s"] for r in nums["rows"] if r["ok"] and r["turn"] == 0], 50),
           "sessions_per_instance": _per_instance(nums["sessions"]), "sessions": nums["sessions"], "rows": nums["rows"]}
    return out


def _per_instance(sessions):
    counts = {}
    for sess in sessions:
        for inst in sess["instances_used"]:
            counts[inst] = counts.get(inst, 0) + 1
    return counts


def section_routing(args, meta):
    key_file = CLIENT_KEY_FILE
    if not (_wait([u for _h, _i, u in LAB_INSTANCES] + [ROUTER_URL], timeout=10) and os.path.exists(key_file)):
        return {"skipped": True, "reason": "the lab (instances, router, API key) is not up: make lab"}
    with open(key_file) as handle:
        api_key = handle.read().strip()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    results = []
    try:
        for policy in args.routing_policies:
            log("routing: policy %s" % policy)
            results.append(run_policy(policy, args, api_key, stamp))
    finally:
        rc, _seconds, tail = converge_router(None)
        restored = rc == 0
        if not restored:
            log("routing: restoring the lab's router policy failed: %s" % tail[-400:])
    return {"policies": results, "sessions": args.routing_sessions, "turns": args.routing_turns,
            "prefix_mix_tokens": [PREFIX_MIX[s % len(PREFIX_MIX)] for s in range(args.routing_sessions)],
            "order": "shuffled (seeded; same order for every policy)", "loadavg_after": "%.1f" % os.getloadavg()[0],
            "lab_policy_restored": restored}


def render_markdown(section):
    lines = ["## Routing policies on the lab", ""]
    if section.get("skipped"):
        return lines + ["Skipped: %s" % section["reason"], ""]
    lines += ["%d sessions x (1 + %d) turns through the router, one request at a time, prefixes of %s estimated tokens, "
              "%s; each policy with its own prefix seed (same lengths and order) so every policy starts cold. "
              "Source = where the repeat turn's prefix came from. CPU lab, loaded machine: TTFTs are noisy." % (
                  section["sessions"], section["turns"], "/".join(str(x) for x in sorted(set(section["prefix_mix_tokens"]))),
                  section["order"]), "",
              "| policy | requests | failed | repeat turns on holding instance | first repeat on holder | GPU prefix cache | "
              "shared tier | recomputed | TTFT median s | TTFT p95 s | repeat TTFT median s | repeat TTFT p95 s | "
              "sessions per instance |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for p in section["policies"]:
        if p.get("error"):
            lines.append("| %s | error: %s |" % (p["policy"], p["error"][:200]))
            continue
        lines.append("| %s | %d | %d | %d/%d (%s) | %s | %d | %d | %d | %s | %s | %s | %s | %s |" % (
            p["policy"], p["requests"], p["failed"], p["repeat_on_holding_instance"], p["repeat_turns"],
            _f(p["holding_ratio"], "%.2f"), _f(p["first_repeat_holding_ratio"], "%.2f"), p["sources"]["gpu_prefix_cache"],
            p["sources"]["shared_tier"], p["sources"]["recomputed"], _f(p["ttft_median_s"], "%.3f"),
            _f(p["ttft_p95_s"], "%.3f"), _f(p["ttft_repeat_median_s"], "%.3f"), _f(p["ttft_repeat_p95_s"], "%.3f"),
            ", ".join("%s %d" % kv for kv in sorted(p["sessions_per_instance"].items()))))
    lines += ["", "The lab's router policy was %s afterwards." % (
        "restored" if section.get("lab_policy_restored") else "NOT restored (run playbooks/router.yml)"), ""]
    return lines
