# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the benchmark sections and scripts/bench.py share: paths, units, the log, the
kv_sizing filter (loaded from plugins/filter), the reference data, small number helpers, and
time_command() (the converge section's timer and bench.py's --converge LABEL=COMMAND hook).
"""

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DATA_FILE = os.path.join(ROOT, "docs", "benchmarks", "gpu_prefill_rates.yml")
MB = 1e6
GB = 1e9


def log(message):
    sys.stderr.write("[bench %s] %s\n" % (time.strftime("%H:%M:%S"), message))
    sys.stderr.flush()


def _load_module(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


kv = _load_module("kvcache_offload_kv_sizing", os.path.join(ROOT, "plugins", "filter", "kv_sizing.py"))


def load_reference(path=DATA_FILE):
    import yaml
    with open(path) as handle:
        return yaml.safe_load(handle)


def ratio(a, b):
    if a is None or b in (None, 0):
        return None
    return a / b


def _f(value, fmt="%.1f", none="-"):
    return none if value is None else fmt % value


# ---------------------------------------------------------------------------------------------
# converge hook (for the lead's `make bench`: site.yml no-op reruns)

RECAP_LINE = re.compile(r"^(?P<host>\S+)\s+:\s+(?P<counts>(?:\w+=\d+\s*)+)$")


def parse_play_recap(text):
    """{host: {ok, changed, unreachable, failed, skipped, rescued, ignored}} from the last PLAY RECAP."""
    lines = (text or "").splitlines()
    start = None
    for index, line in enumerate(lines):
        if line.startswith("PLAY RECAP"):
            start = index
    if start is None:
        return {}
    hosts = {}
    for line in lines[start + 1:]:
        match = RECAP_LINE.match(line.strip())
        if not match:
            if line.strip() == "":
                continue
            break
        hosts[match.group("host")] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match.group("counts"))}
    return hosts


def time_command(command, label=None, cwd=ROOT, env=None, timeout=3600, log_path=None):
    """Run a command (list or string), time it, and read its PLAY RECAP.

    With log_path, the whole output is also written there.

    Returns {label, command, rc, seconds, hosts, per_host_seconds, recap, changed_total,
    failed_total, unreachable_total, timed_out, output_tail}. Never raises for the command's
    own failure; the caller decides what a non-zero rc means.
    """
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    merged = dict(os.environ)
    merged.update(env or {})
    started = time.monotonic()
    timed_out = False
    sink = open(log_path, "w+b") if log_path else subprocess.PIPE  # the log fills while it runs
    try:
        proc = subprocess.run(argv, cwd=cwd, env=merged, stdout=sink, stderr=subprocess.STDOUT,
                              timeout=timeout, check=False)
        output = (proc.stdout or b"").decode("utf-8", errors="replace")
        rc = proc.returncode
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode("utf-8", errors="replace")
        rc = None
        timed_out = True
    except OSError as exc:
        output = str(exc)
        rc = None
    seconds = time.monotonic() - started
    if log_path:
        sink.seek(0)
        output = sink.read().decode("utf-8", errors="replace") or output
        sink.close()
    recap = parse_play_recap(output)
    total = {}
    for counts in recap.values():
        for key, value in counts.items():
            total[key] = total.get(key, 0) + value
    return {
        "label": label or " ".join(argv),
        "command": argv,
        "rc": rc,
        "seconds": seconds,
        "hosts": len(recap),
        "per_host_seconds": seconds / len(recap) if recap else None,
        "recap": recap,
        "changed_total": total.get("changed") if recap else None,
        "failed_total": total.get("failed") if recap else None,
        "unreachable_total": total.get("unreachable") if recap else None,
        "timed_out": timed_out,
        "output_tail": output[-4000:],
    }


# ---------------------------------------------------------------------------------------------
# module runs (scripts/bench_plugins/callback/module_runs.py)

MODULE_RUNS_PLUGIN_DIR = os.path.join(HERE, "bench_plugins", "callback")
MODULE_RUNS_ENV = "KVCACHE_MODULE_RUNS_LOG"


def module_runs_env(log_path, configured_callbacks="ansible.posix.profile_tasks"):
    """Environment that makes ansible-playbook count its module runs into log_path (JSON lines).

    ANSIBLE_CALLBACKS_ENABLED replaces ansible.cfg's list, so the configured callbacks are
    repeated here.
    """
    plugin_path = os.pathsep.join(p for p in (MODULE_RUNS_PLUGIN_DIR, os.environ.get("ANSIBLE_CALLBACK_PLUGINS")) if p)
    return {MODULE_RUNS_ENV: log_path, "ANSIBLE_CALLBACK_PLUGINS": plugin_path,
            "ANSIBLE_CALLBACKS_ENABLED": ",".join(c for c in (configured_callbacks, "module_runs") if c)}


def count_module_runs(log_path, nodes=None, top=10):
    """Module runs read from the callback's JSON lines.

    Returns {total, per_target: {target: n}, per_node: mean over the targets in nodes (without
    nodes: over every target but localhost; None when there is none), controller: runs on
    localhost, by_module: [[module, n]...], by_task: [[task, n]...] (largest first), per_play:
    [[play, runs, runs per node]...] in the order the plays ran, the per-node mean over the same
    nodes as per_node}, or None when there is no log.
    """
    if not log_path or not os.path.exists(log_path):
        return None
    per_target, by_module, by_task, total = {}, {}, {}, 0
    per_play, play_targets = {}, {}
    with open(log_path, encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except ValueError:
                continue
            total += 1
            target = row.get("target") or "?"
            per_target[target] = per_target.get(target, 0) + 1
            module = (row.get("module") or "?").replace("ansible.legacy.", "ansible.builtin.")
            by_module[module] = by_module.get(module, 0) + 1
            by_task[row.get("task") or "?"] = by_task.get(row.get("task") or "?", 0) + 1
            play = row.get("play") or "?"
            per_play[play] = per_play.get(play, 0) + 1  # dicts keep the order the plays ran
            play_targets.setdefault(play, {})
            play_targets[play][target] = play_targets[play].get(target, 0) + 1
    if nodes is None:
        nodes = [t for t in per_target if t != "localhost"]
    node_counts = [per_target.get(n, 0) for n in nodes]

    def _top(counts):
        return [[k, v] for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]]
    return {
        "total": total,
        "per_target": dict(sorted(per_target.items())),
        "per_node": (sum(node_counts) / float(len(node_counts))) if node_counts else None,
        "controller": per_target.get("localhost", 0),
        "by_module": _top(by_module),
        "by_task": _top(by_task),
        "per_play": [[play, runs, (sum(play_targets[play].get(n, 0) for n in nodes) / float(len(nodes))) if nodes else None]
                     for play, runs in per_play.items()],
    }
