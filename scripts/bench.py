#!/usr/bin/env python
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""kvcache.offload benchmarks: storage throughput, lab tier effectiveness, break-even prediction.

    scripts/bench.py            full run  (build/bench/bench.json + bench.md)
    scripts/bench.py --smoke    small run for CI (< 3 minutes once the venvs exist)

Run with the tool venv's Python (build/venv: boto3, PyYAML, ansible-core). Sections:

storage   KV-chunk-sized PUT/GET at 1 and 8 streams, on two tiers, each through LMCache's
          own remote connector and through a plain client on the same tier in the same run:
          fs tier (a local directory):   LMCache FSConnector  vs plain file I/O
          s3 tier (SeaweedFS, 127.0.0.1): LMCache S3Connector  vs plain boto3
          The chunk size comes from the kv_sizing filter and a model config.
lab       TTFT cold / same-instance hit / cross-instance hit through LMCache's servers for prompts
          of 512-8192 tokens, medians of N rounds, on the fs and the s3 tier of the running lab
          (skipped when it is down; the s3 tier is converged for it and the lab's tier restored).
predict   measured tier bandwidth + the prefill table (docs/benchmarks/gpu_prefill_rates.yml)
          -> does loading from each tier beat recomputing, for named models and contexts.
routing   router policies compared on the lab (default round_robin, cache_aware): the router alone
          reconverged per policy, the same multi-session prompt mix through it, hit sources and
          TTFT median/p95 per policy; the lab's policy restored after (scripts/bench_routing.py).
converge  cold run and no-op rerun of the node-side playbooks on 2, 8 and 32 simulated nodes
          (containers on their own network, engines installed but not started), and the
          full-stack lab rerun when the lab is up (scripts/bench_converge.py); plus
          time_command() for any command (--converge LABEL=COMMAND).

Every loop is bounded in count and time; all traffic goes to 127.0.0.1 or the lab containers.
"""

import argparse
import datetime
import json
import os
import platform
import sys
import time

# The sections, one module each beside this file (scripts/ is on sys.path when this file runs);
# this file keeps the command line, the frame of the report and the --converge hook.
import bench_converge
import bench_lab
import bench_predict
import bench_routing
import bench_storage
from bench_common import ROOT, _f, load_reference, log, time_command


def render_markdown(report):
    lines = ["# kvcache.offload benchmark report", ""]
    meta = report["meta"]
    lines.append("Run %s on %s (%s CPUs, load %s), mode `%s`, %.0f s. JSON: `bench.json`."
                 % (meta["started"], meta["host"], meta["cpus"], meta["loadavg"], meta["mode"], meta["seconds"]))
    lines.append("")
    if report.get("storage"):
        lines += bench_storage.render_markdown(report["storage"])
    if report.get("lab"):
        lines += bench_lab.render_markdown(report["lab"])
    if report.get("predict"):
        lines += bench_predict.render_markdown(report["predict"])
    if report.get("routing"):
        lines += bench_routing.render_markdown(report["routing"])
    if report.get("converge_sim"):
        lines += bench_converge.render_markdown(report["converge_sim"])
    conv = report.get("converge")
    if conv:
        lines += ["## Converge timing", "", "| label | rc | seconds | hosts | s/host | changed | failed |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for c in conv:
            lines.append("| %s | %s | %.1f | %d | %s | %s | %s |" % (
                c["label"], c["rc"], c["seconds"], c["hosts"], _f(c["per_host_seconds"]), c["changed_total"],
                c["failed_total"]))
        lines.append("")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------

def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="small, fast run for CI")
    parser.add_argument("--out", default=os.path.join(ROOT, "build", "bench"))
    parser.add_argument("--sections", default=None,
                        help="comma list of storage, lab, predict, routing, converge (default: all five; --smoke: "
                             "storage,lab,predict); --converge commands run in any case")
    parser.add_argument("--routing-policies", default="round_robin,cache_aware",
                        help="vllm-router policies the routing section compares on the lab")
    parser.add_argument("--routing-sessions", type=int, default=6)
    parser.add_argument("--routing-turns", type=int, default=4, help="repeat turns per session")
    parser.add_argument("--routing-model", default="tiny-qwen2", help="the lab's served model name")
    parser.add_argument("--model", default=None, help="model of docs/benchmarks/gpu_prefill_rates.yml sizing the chunk")
    parser.add_argument("--chunk-size", type=int, default=256)
    parser.add_argument("--sweep-chunks", default=None,
                        help="chunk sizes (tokens) of the storage section's LMCache sweep (default 256,512,1024,2048)")
    parser.add_argument("--objects", type=int, default=None)
    parser.add_argument("--streams", default="1,8")
    parser.add_argument("--max-seconds", type=float, default=None, help="per PUT or GET phase")
    parser.add_argument("--worker-timeout", type=float, default=None, help="seconds for one LMCache worker process")
    parser.add_argument("--install-timeout", type=float, default=1200)
    parser.add_argument("--lmcache-python", default=os.environ.get("KVCACHE_BENCH_LMCACHE_PYTHON"))
    parser.add_argument("--no-venv-create", action="store_true", help="never create an LMCache venv")
    parser.add_argument("--no-lmcache", action="store_true")
    parser.add_argument("--weed", default=os.environ.get("KVCACHE_BENCH_WEED"))
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--sizes", default=None, help="lab prompt sizes in tokens")
    parser.add_argument("--lab-max-seconds", type=float, default=None, help="time limit of the lab section per tier")
    parser.add_argument("--lab-tiers", default=None,
                        help="comma list of fs, s3: the tiers the lab section measures (default fs,s3; --smoke: fs); "
                             "a tier the lab does not run is converged for the bench, and the lab's own restored")
    parser.add_argument("--contexts", default="4096,32768,131072")
    parser.add_argument("--mfu", type=float, default=None)
    parser.add_argument("--tier", action="append", default=[], metavar="NAME=GBPS",
                        help="extra tier bandwidth for the prediction (e.g. ontap-prod=12.5)")
    parser.add_argument("--converge", action="append", default=[], metavar="LABEL=COMMAND",
                        help="time a command and read its PLAY RECAP (e.g. 'noop=ansible-playbook site.yml')")
    parser.add_argument("--converge-nodes", default="2,8,32",
                        help="simulated node counts of the converge section ('none': only the lab rerun)")
    parser.add_argument("--converge-image", default=bench_converge.SIM_IMAGE)
    lab_uv_cache = os.path.join(os.environ.get("KVCACHE_CACHE_DIR") or os.path.join(ROOT, "build", "cache"), "lab", "uv")
    parser.add_argument("--converge-uv-cache", default=lab_uv_cache,
                        help="uv cache the simulated nodes share (default: the lab's, so the seed build is warm)")
    parser.add_argument("--converge-timeout", type=float, default=3600, help="seconds for one playbook run")
    parser.add_argument("--no-converge-lab", dest="converge_lab", action="store_false",
                        help="never time the full-stack lab rerun (default: when the lab is up)")
    parser.add_argument("--mitogen", action="store_true",
                        help="the lab rerun under Mitogen's strategy (opt-in, docs/mitogen.md; installs mitogen into "
                             "build/mitogen when missing)")
    parser.add_argument("--keep", action="store_true", help="keep the SeaweedFS data directory")
    args = parser.parse_args(argv)
    smoke = args.smoke
    args.model = args.model or ("tiny-qwen2" if smoke else "Llama-3.1-8B")
    args.objects = args.objects or (16 if smoke else 32)
    args.max_seconds = args.max_seconds or (10.0 if smoke else 30.0)
    args.rounds = args.rounds or (2 if smoke else 5)
    args.worker_timeout = args.worker_timeout or (150.0 if smoke else 600.0)
    args.sizes = [int(s) for s in (args.sizes or ("512,1024" if smoke else "512,1024,2048,4096,8192")).split(",")]
    args.lab_tiers = [t.strip() for t in (args.lab_tiers or ("fs" if smoke else "fs,s3")).split(",") if t.strip()]
    if set(args.lab_tiers) - {"fs", "s3"}:
        parser.error("--lab-tiers takes fs and s3")
    args.lab_max_seconds = args.lab_max_seconds or (60.0 if smoke else 600.0)
    args.streams = [int(s) for s in args.streams.split(",")]
    args.sweep_chunks = [int(c) for c in args.sweep_chunks.split(",")] if args.sweep_chunks else None
    args.contexts = [int(c) for c in args.contexts.split(",")]
    args.sections = args.sections or ("storage,lab,predict" if smoke else "storage,lab,predict,routing,converge")
    args.routing_policies = [p.strip() for p in args.routing_policies.split(",") if p.strip()]
    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    try:
        args.converge_nodes = bench_converge.parse_nodes(args.converge_nodes)
    except ValueError as exc:
        parser.error(str(exc))
    if max(args.streams) > 64 or args.objects > 1024:
        parser.error("streams <= 64 and objects <= 1024")
    return args


def main(argv=None):
    args = parse_args(argv)
    out_dir = os.path.abspath(args.out)
    os.makedirs(out_dir, exist_ok=True)
    started = time.monotonic()
    reference = load_reference()
    report = {"meta": {
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "cpus": os.cpu_count(),
        "loadavg": "%.1f" % os.getloadavg()[0], "mode": "smoke" if args.smoke else "full",
        "argv": sys.argv[1:], "python": sys.version.split()[0],
    }}
    if "storage" in args.sections:
        report["storage"] = bench_storage.section_storage(args, reference, out_dir, report["meta"])
    if "lab" in args.sections:
        try:
            report["lab"] = bench_lab.section_lab(args, out_dir, report["meta"])
        except Exception as exc:  # pylint: disable=broad-except
            report["lab"] = {"skipped": True, "reason": "error: %s: %s" % (type(exc).__name__, exc)}
    if "predict" in args.sections:
        report["predict"] = bench_predict.section_predict(args, reference, report.get("storage"))
    if "routing" in args.sections:
        try:
            report["routing"] = bench_routing.section_routing(args, report["meta"])
        except Exception as exc:  # pylint: disable=broad-except
            report["routing"] = {"skipped": True, "reason": "error: %s: %s" % (type(exc).__name__, exc)}
    if "converge" in args.sections:
        report["converge_sim"] = bench_converge.section_converge(args, out_dir, time_command)
    if args.converge:
        report["converge"] = []
        for spec in args.converge:
            label, _sep, command = spec.partition("=")
            log("converge: %s: %s" % (label, command))
            report["converge"].append(time_command(command, label=label))
    report["meta"]["seconds"] = time.monotonic() - started
    with open(os.path.join(out_dir, "bench.json"), "w") as handle:
        json.dump(report, handle, indent=2, sort_keys=True, default=str)
    with open(os.path.join(out_dir, "bench.md"), "w") as handle:
        handle.write(render_markdown(report))
    log("wrote %s and %s (%.0f s)"
        % (os.path.join(out_dir, "bench.json"), os.path.join(out_dir, "bench.md"), report["meta"]["seconds"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
