#!/usr/bin/env python
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Before/after of the full-stack lab rerun, in alternating rounds on one lab (issue #24).

    python scripts/bench_rerun.py --variant before=/path/to/old/tree --variant after=. \\
        --variant mitogen=.:mitogen --rounds 3 --out build/bench/rerun

Each variant is LABEL=TREE[:mitogen]: a checkout of this collection (its playbooks and roles;
the lab's inventory and state always come from this checkout, so every variant converges the
same lab). `:mitogen` runs it under Mitogen's strategy (build/mitogen, see docs/mitogen.md) with
inventories/lab-mitogen.yml. A round runs every variant once, in order; rounds alternate the
variants so that a drift of the machine's speed hits them alike.

Measured per run (scripts/bench_converge.py): wall time, PLAY RECAP, module runs per host
(scripts/bench_plugins/callback/module_runs.py), and the rerun's own CPU: the ansible-playbook
process tree (getrusage of the children), the lab containers' cgroups and their containerd-shims
(lab_cpu_delta). /proc/stat's machine CPU is recorded too, but other work on the machine is in it.
Writes <out>/rerun.json and <out>/rerun.md; holds the lab's lock /tmp/kvcache-lab.lock per run.
"""

import argparse
import fcntl
import json
import os
import statistics
import sys
import time

import bench_common
import bench_converge

ROOT = bench_converge.ROOT
MITOGEN_DIR = bench_converge.MITOGEN_DIR
LAB_INVENTORY = os.path.join(ROOT, "inventories", "lab", "hosts.yml")
MITOGEN_INVENTORY = os.path.join(ROOT, "inventories", "lab-mitogen.yml")


def parse_variant(text):
    """'LABEL=TREE[:mitogen]' -> {label, tree (absolute), mitogen}."""
    label, sep, rest = str(text).partition("=")
    if not sep or not label or not rest:
        raise ValueError("a variant is LABEL=TREE[:mitogen]: %r" % text)
    tree, _colon, flag = rest.partition(":")
    if flag not in ("", "mitogen"):
        raise ValueError("unknown flag %r in %r (only :mitogen)" % (flag, text))
    return {"label": label, "tree": os.path.abspath(tree), "mitogen": flag == "mitogen"}


def variant_argv(variant, python=sys.executable):
    """ansible-playbook arguments of one variant: the lab inventory of this checkout (plus the
    Mitogen variant's), the variant tree's site.yml."""
    argv = [os.path.join(os.path.dirname(python), "ansible-playbook"), "-i", LAB_INVENTORY]
    if variant["mitogen"]:
        argv += ["-i", MITOGEN_INVENTORY]
    return argv + [os.path.join(variant["tree"], "playbooks", "site.yml")]


def variant_env(variant, mitogen_dir=MITOGEN_DIR):
    """The variant tree's ansible.cfg and collection (kvcache.offload linked to the tree)."""
    coll = os.path.join(variant["tree"], "build", "collections")
    env = {"ANSIBLE_CONFIG": os.path.join(variant["tree"], "ansible.cfg"), "ANSIBLE_COLLECTIONS_PATH": coll}
    if variant["mitogen"]:
        env.update(bench_converge.mitogen_strategy_env(mitogen_dir))
    return env


def ensure_collection_link(tree):
    """<tree>/build/collections/ansible_collections/kvcache/offload -> tree (as `make collection`)."""
    link = os.path.join(tree, "build", "collections", "ansible_collections", "kvcache", "offload")
    if not os.path.islink(link):
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(tree, link)
    return link


def summarize(runs):
    """Per label: mean wall, rerun CPU, controller CPU, machine CPU, module runs per node; changed."""
    out = {}
    for run in runs:
        out.setdefault(run["variant"], []).append(run)
    summary = {}
    for label, rows in out.items():
        def mean(key, rows=rows):
            values = [r[key] for r in rows if r.get(key) is not None]
            return statistics.mean(values) if values else None
        summary[label] = {"runs": len(rows), "seconds": mean("seconds"), "rerun_cpu_seconds": mean("rerun_cpu_seconds"),
                          "controller_cpu_seconds": mean("controller_cpu_seconds"),
                          "machine_cpu_seconds": mean("machine_cpu_seconds"),
                          "module_runs_per_node": mean("module_runs_per_node"),
                          "changed": [r.get("changed_total") for r in rows], "rc": [r.get("rc") for r in rows]}
    return summary


def render_markdown(runs, summary):
    def sec(value):
        return "-" if value is None else "%.1f" % value
    lines = ["# Lab rerun: alternating rounds", "",
             "| round | variant | wall s | rerun CPU s | controller CPU s | exec'd (shims) CPU s | containers' cgroups CPU s | docker daemons CPU s "
             "| machine CPU s (/proc/stat) | module runs/node | module runs on the controller | changed | rc |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in runs:
        lab = r.get("lab_cpu") or {}
        lines.append("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["round"], r["variant"], sec(r.get("seconds")), sec(r.get("rerun_cpu_seconds")),
            sec(r.get("controller_cpu_seconds")), sec(lab.get("shims")), sec(lab.get("containers_total")),
            sec(lab.get("daemons")), sec(r.get("machine_cpu_seconds")), sec(r.get("module_runs_per_node")),
            r.get("module_runs_controller", "-"), r.get("changed_total"), r.get("rc")))
    lines += ["", "| variant | runs | wall s | rerun CPU s | controller CPU s | machine CPU s | module runs/node |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, s in summary.items():
        lines.append("| %s | %d | %s | %s | %s | %s | %s |" % (
            label, s["runs"], sec(s["seconds"]), sec(s["rerun_cpu_seconds"]), sec(s["controller_cpu_seconds"]),
            sec(s["machine_cpu_seconds"]), sec(s["module_runs_per_node"])))
    return lines + [""]


def _locked(path, timeout):
    handle = open(path, "a")
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return handle
        except OSError:
            if time.monotonic() > deadline:
                handle.close()
                raise RuntimeError("%s held by someone else for %.0f s" % (path, timeout))
            time.sleep(2)


def one_run(variant, round_no, out_dir, timeout, mitogen_dir=MITOGEN_DIR):
    ensure_collection_link(variant["tree"])
    up, missing = bench_converge._lab_running()
    if not up:
        raise RuntimeError("lab not up (%s not running): make lab" % ", ".join(missing))
    log_path = os.path.join(out_dir, "%02d-%s.log" % (round_no, variant["label"]))
    lock = _locked(bench_converge.LAB_LOCK, timeout)
    try:
        result = bench_converge._timed(bench_common.time_command, variant_argv(variant), variant["label"], log_path,
                                       timeout, env=variant_env(variant, mitogen_dir),
                                       lab_ids=bench_converge.lab_container_ids(), cwd=variant["tree"])
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()
    runs = result.get("module_runs") or {}
    result.update({"variant": variant["label"], "round": round_no, "tree": variant["tree"],
                   "mitogen": variant["mitogen"], "module_runs_per_node": runs.get("per_node"),
                   "module_runs_controller": runs.get("controller")})
    result.pop("output_tail", None)
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", action="append", required=True, help="LABEL=TREE[:mitogen], in round order")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(ROOT, "build", "bench", "rerun"))
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per run (and for the lab lock)")
    parser.add_argument("--mitogen-dir", default=MITOGEN_DIR)
    args = parser.parse_args(argv)
    variants = [parse_variant(v) for v in args.variant]
    if any(v["mitogen"] for v in variants) and not os.path.isdir(os.path.join(args.mitogen_dir, "ansible_mitogen")):
        parser.error("%s has no ansible_mitogen: make mitogen (docs/mitogen.md)" % args.mitogen_dir)
    args.out = os.path.abspath(args.out)  # the runs' working directory is each variant's tree
    os.makedirs(args.out, exist_ok=True)
    runs = []
    for round_no in range(1, args.rounds + 1):
        for variant in variants:
            bench_common.log("rerun: round %d, %s" % (round_no, variant["label"]))
            run = one_run(variant, round_no, args.out, args.timeout, args.mitogen_dir)
            bench_common.log("rerun: %s %.1f s, rerun CPU %.1f s, changed=%s, rc %s" % (
                variant["label"], run["seconds"], run.get("rerun_cpu_seconds") or -1, run.get("changed_total"),
                run.get("rc")))
            runs.append(run)
            summary = summarize(runs)
            with open(os.path.join(args.out, "rerun.json"), "w") as handle:
                json.dump({"runs": runs, "summary": summary}, handle, indent=2, sort_keys=True, default=str)
            with open(os.path.join(args.out, "rerun.md"), "w") as handle:
                handle.write("\n".join(render_markdown(runs, summary)))
    sys.stdout.write("\n".join(render_markdown(runs, summarize(runs))))
    return 0 if all(r.get("rc") == 0 and r.get("changed_total") == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
