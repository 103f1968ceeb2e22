# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the benchmark sections and scripts/bench.py share: paths, units, the log, the
kv_sizing filter (loaded from plugins/filter), the reference data, small number helpers, and
time_command() (the converge section's timer and bench.py's --converge LABEL=COMMAND hook).
"""

import importlib.util
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
