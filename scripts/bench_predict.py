# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The predict section of scripts/bench.py: measured tier bandwidth (the storage section, and
--tier NAME=GBPS) + the prefill table (docs/benchmarks/gpu_prefill_rates.yml) -> does loading
from each tier beat recomputing, for named models and contexts.
"""

from bench_common import GB, MB, _f, kv


def measured_tiers(storage):
    """[(name, bytes/s, source)] from the storage section: GET at the most streams, LMCache when measured."""
    tiers = []
    for tier, data in (storage or {}).get("tiers", {}).items():
        for client in ("lmcache", "plain"):
            runs = (data.get(client) or {}).get("runs")
            if not runs:
                continue
            best = max(runs, key=lambda r: r["streams"])
            mbps = best["get"].get("mb_per_s")
            if mbps:
                label = "%s tier via %s" % (tier, "LMCache" if client == "lmcache" else data.get("plain_client", client))
                tiers.append({"name": "%s/%s" % (tier, client), "label": label, "bytes_per_s": mbps * MB,
                              "source": "measured here: GET, %d streams, %s-byte objects" % (best["streams"],
                                                                                             best["get"]["bytes"] // max(1, best["get"]["objects"]))})
                break
    return tiers


def predict(reference, tiers, contexts, mfu=None):
    """Rows of (model, gpu, tp, context) with the prefill rate and, per tier, load time and speedup."""
    mfu = reference["assumptions"]["mfu"] if mfu is None else mfu
    rows = []
    for entry in reference["prefill_rates"]:
        model = reference["models"][entry["model"]]
        gpu = reference["gpus"][entry["gpu"]]
        per_token = kv.kv_bytes_per_token(model["config"])
        for ctx in contexts:
            rate = kv.kv_prefill_rate(model["config"], gpu["dense_bf16_tflops"], ctx, mfu, entry["tp"])
            row = {"model": entry["model"], "gpu": entry["gpu"], "tp": entry["tp"], "context_tokens": ctx,
                   "bytes_per_token": per_token, "kv_bytes": per_token * ctx, "prefill_tokens_per_s": rate,
                   "recompute_seconds": ctx / rate, "break_even_bandwidth": per_token * rate, "tiers": {}}
            tier_list = list(tiers) + [{"name": "cpu_ram_pcie_nominal",
                                        "bytes_per_s": gpu["host_to_device_gbps_nominal"] * GB * entry["tp"]}]
            for tier in tier_list:
                result = kv.kv_break_even(per_token, ctx, tier["bytes_per_s"], rate)
                row["tiers"][tier["name"]] = {"load_seconds": result["load_seconds"], "speedup": result["speedup"],
                                              "load_wins": result["load_wins"]}
            rows.append(row)
    return rows


def section_predict(args, reference, storage):
    """The predict section: the storage section's tiers and the --tier ones against the prefill table."""
    tiers = measured_tiers(storage)
    for spec in args.tier:
        name, _sep, gbps = spec.partition("=")
        tiers.append({"name": name, "bytes_per_s": float(gbps) * GB, "source": "given with --tier"})
    return {"mfu": args.mfu or reference["assumptions"]["mfu"], "contexts": args.contexts,
            "tiers": tiers, "rows": predict(reference, tiers, args.contexts, args.mfu)}


def render_markdown(pred):
    """The predict section of bench.md (a list of lines)."""
    lines = ["## Load or recompute? Prediction for production models", ""]
    lines.append("Prefill rates are DERIVED from FLOPs at an assumed MFU of %s (see docs/benchmarks/gpu_prefill_rates.yml); "
                 "tier bandwidths are measured here (this machine, not production storage) except the nominal "
                 "PCIe host-to-device rate of the CPU RAM tier. Speedup = recompute time / load time; > 1 means "
                 "loading wins. Break-even = the slowest tier read bandwidth at which loading still wins." % pred["mfu"])
    lines.append("")
    for tier in pred["tiers"]:
        lines.append("- `%s`: %s GB/s (%s)" % (tier["name"], _f(tier["bytes_per_s"] / GB, "%.2f"), tier["source"]))
    lines.append("- `cpu_ram_pcie_nominal`: nominal host-to-device PCIe rate of the GPU x TP (gpus.*.host_to_device_gbps_nominal)")
    lines.append("")
    names = [t["name"] for t in pred["tiers"]] + ["cpu_ram_pcie_nominal"]
    lines.append("| model | GPU x TP | context | prefill tok/s | recompute s | break-even GB/s | " +
                 " | ".join("%s speedup" % n for n in names) + " |")
    lines.append("| --- | --- | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _n in names) + " |")
    for row in pred["rows"]:
        cells = []
        for n in names:
            t = row["tiers"][n]
            cells.append("%s %s" % (_f(t["speedup"], "%.2fx"), "load" if t["load_wins"] else "recompute"))
        lines.append("| %s | %s x%d | %d | %s | %s | %s | %s |" % (
            row["model"], row["gpu"], row["tp"], row["context_tokens"], _f(row["prefill_tokens_per_s"], "%.0f"),
            _f(row["recompute_seconds"], "%.3f"), _f(row["break_even_bandwidth"] / GB, "%.2f"), " | ".join(cells)))
    lines.append("")
    return lines
