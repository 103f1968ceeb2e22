"""Check an lmcache-config.yaml the way LMCache will read it, before it is installed.

Run with the node's engine venv: python check_lmcache_config.py FILE
Loads FILE with LMCache's own config loader (LMCacheEngineConfig.from_file), then
refuses what LMCache would accept silently but get wrong:
- a key LMCache does not know (it only logs a warning and ignores it);
- a string where LMCache expects a boolean ("false" is read as True);
- a legacy fs:/// remote_url with no host (0 hits, a warning only);
- save_chunk_meta enabled with an S3 remote (must be false for S3).
Exit 0 and a JSON summary when the file is good; exit 1 with one line per problem.
"""
import json
import os
import sys

os.environ["LMCACHE_TRACK_USAGE"] = "false"
os.environ["DO_NOT_TRACK"] = "1"
os.environ.setdefault("LMCACHE_LOG_LEVEL", "ERROR")


def problems_in(raw, definitions, aliases):
    problems = []
    for key, value in raw.items():
        name = aliases.get(key, key)
        if name not in definitions:
            problems.append("unknown key %r: LMCache would ignore it" % key)
            continue
        if definitions[name].get("type") is bool and not isinstance(value, bool):
            problems.append(
                "%s is %r (%s), not a YAML boolean: LMCache reads any non-empty string as true"
                % (key, value, type(value).__name__))
    remote_url = raw.get("remote_url") or ""
    if remote_url.startswith("fs:///"):
        problems.append(
            "remote_url %r has no host: LMCache ignores it with a warning (0 hits); use "
            "remote_storage_plugins: [fs] with extra_config remote_storage_plugin.fs.base_path" % remote_url)
    extra = raw.get("extra_config") or {}
    for key, value in extra.items():
        if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no"):
            problems.append("extra_config.%s is the string %r: write a YAML boolean" % (key, value))
    if remote_url.startswith("s3://") and (extra.get("save_chunk_meta") or raw.get("save_chunk_meta")):
        problems.append("save_chunk_meta must be false with an S3 remote")
    return problems


def main():
    if len(sys.argv) != 2:
        sys.stderr.write("usage: check_lmcache_config.py FILE\n")
        return 2
    path = sys.argv[1]
    import yaml

    with open(path, encoding="utf-8") as handle:
        raw = yaml.safe_load(handle) or {}
    if not isinstance(raw, dict):
        print("%s: not a YAML mapping" % path)
        return 1

    from lmcache.v1 import config as lmc

    aliases = getattr(lmc, "_CONFIG_ALIASES", {}) or {}
    problems = problems_in(raw, lmc._CONFIG_DEFINITIONS, aliases)
    try:
        loaded = lmc.LMCacheEngineConfig.from_file(path)
        validate = getattr(loaded, "validate", None)
        if callable(validate):
            validate()
    except Exception as exc:  # LMCache's own loader refused the file
        problems.append("LMCache's loader refused the file: %s" % exc)
    if problems:
        for problem in problems:
            print("%s: %s" % (path, problem))
        return 1
    print(json.dumps({
        "file": path,
        "chunk_size": loaded.chunk_size,
        "local_cpu": loaded.local_cpu,
        "max_local_cpu_size": loaded.max_local_cpu_size,
        "remote_url": loaded.remote_url,
        "remote_storage_plugins": getattr(loaded, "remote_storage_plugins", None),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
