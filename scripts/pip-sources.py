"""Print the controller's local Python package sources as JSON, for the lab.

pip on these machines is configured (``pip config list``) with local wheel sources:
find-links directories and file:// indexes (PyTorch's CPU wheel lies only there).
uv ignores pip's configuration, so the lab passes them to uv on the nodes
explicitly and mounts them read-only into the lab containers. Nothing here is
written into the repository: the sources are read from this machine at run time.
"""
import json
import re
import subprocess
import sys

KEYS = {"find-links": "find_links", "extra-index-url": "extra_index_urls", "index-url": "extra_index_urls"}


def local_path(source):
    if source.startswith("file://"):
        return source[len("file://"):]
    if source.startswith("/"):
        return source
    return None


def main():
    out = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True, text=True, timeout=60, check=False,
    ).stdout
    result = {"find_links": [], "extra_index_urls": [], "mounts": []}
    for line in out.splitlines():
        match = re.match(r"^[^.]*\.([a-z-]+)='(.*)'$", line.strip())
        if not match or match.group(1) not in KEYS:
            continue
        for source in match.group(2).split():
            path = local_path(source)
            if path is None:
                continue  # remote indexes: the nodes reach PyPI themselves
            key = KEYS[match.group(1)]
            value = path if key == "find_links" else "file://" + path
            if value not in result[key]:
                result[key].append(value)
            mount = path.rstrip("/")
            if key == "extra_index_urls" and mount.endswith("/simple"):
                mount = mount[: -len("/simple")]
            if mount not in result["mounts"]:
                result["mounts"].append(mount)
    json.dump(result, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
