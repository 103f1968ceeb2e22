"""Print the host's own Debian apt sources as one-line ``deb`` entries.

Used to build the lab/molecule base image with mmdebstrap from the mirror this
machine is already configured for: no mirror host name is ever written into the
repository. Only entries for the host's Debian release (``<codename>``,
``<codename>-updates``, ``<codename>-security``) are kept; third-party
repositories (vendor SDKs, Node.js, ...) are left out of the image.
"""
import glob
import os
import re
import sys


def codename():
    with open("/etc/os-release", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("VERSION_CODENAME="):
                return line.split("=", 1)[1].strip().strip('"')
    sys.exit("apt-sources: no VERSION_CODENAME in /etc/os-release")


def deb822_entries(path):
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    for stanza in re.split(r"\n\s*\n", text):
        fields = {}
        for line in stanza.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if ":" in line and not line[0].isspace():
                key, value = line.split(":", 1)
                fields[key.strip().lower()] = value.strip()
        if fields.get("enabled", "yes").lower() == "no":
            continue
        if "deb" not in fields.get("types", "").split():
            continue
        for uri in fields.get("uris", "").split():
            for suite in fields.get("suites", "").split():
                yield uri, suite, fields.get("components", "main").split()


def one_line_entries(path):
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            line = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
            if len(line) >= 3 and line[0] == "deb":
                yield line[1], line[2], line[3:] or ["main"]


def main():
    release = codename()
    wanted = {release, release + "-updates", release + "-security"}
    entries = []
    files = ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*"))
    for path in files:
        if not os.path.isfile(path):
            continue
        parse = deb822_entries if path.endswith(".sources") else one_line_entries
        for uri, suite, components in parse(path):
            if suite in wanted:
                comps = [c for c in components if c in ("main", "contrib", "non-free", "non-free-firmware")]
                line = "deb %s %s %s" % (uri, suite, " ".join(comps or ["main"]))
                if line not in entries:
                    entries.append(line)
    if not entries:
        sys.exit("apt-sources: no %s entries in the host's apt sources" % release)
    print("\n".join(entries))


if __name__ == "__main__":
    main()
