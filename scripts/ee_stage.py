"""Stage the inputs of the execution environment build (scripts/ee.sh, `make ee`).

    python scripts/ee_stage.py stage --tarball build/dist/kvcache-offload-0.1.0.tar.gz
        writes build/ee/stage/collections/*.tar.gz (the collection tarball and the collections
        it depends on, packed from the PyPI `ansible` package of this Python) and
        build/ee/stage/pip/ (pip.conf, ca-bundle.crt, pip's pinned wheel), then prints the
        hash of everything the image is built from (the image tag).
    python scripts/ee_stage.py lock
        rewrites ee/requirements.txt (every package == pinned) from ee/requirements.in.

pip on this machine reads its package sources and CA bundle from its own configuration
(`pip config list`). The build inside docker gets the same, read here at build time and
never written into the repository: the remote index settings go into a build-only pip.conf,
the CA bundle pip trusts is copied next to it. Local (file://, directory) sources are left
out: a docker build cannot reach this machine's disk, and nothing in the EE lies only there.
"""
import argparse
import hashlib
import io
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import sysconfig
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LIST_KEYS = ("index-url", "extra-index-url", "trusted-host")
SINGLE_KEYS = ("cert", "timeout", "default-timeout")
# Python distributions the Debian base image brings (python3-apt); everything else is pinned.
BASE_IMAGE_PACKAGES = frozenset(("python-apt",))
COLLECTION_FILE = re.compile(r"^collections/([a-z0-9_]+)-([a-z0-9_]+)-(\d+\.\d+\.\d+[^/]*)\.tar\.gz$")


def is_remote(source):
    return source.startswith(("http://", "https://"))


def parse_pip_config(text):
    """`pip config list` output -> the settings a build inside docker can use.

    Later lines win for single values (pip prints global, user, site, then env); list values
    are merged in order. Local sources are dropped (is_remote)."""
    settings = {"index-url": [], "extra-index-url": [], "trusted-host": [], "cert": None, "timeout": None}
    for line in text.splitlines():
        match = re.match(r"^[^=]*?\.([a-z-]+)='(.*)'$", line.strip())
        if not match:
            continue
        key, value = match.group(1), match.group(2)
        if key in ("index-url", "extra-index-url"):
            for source in value.split():
                if is_remote(source) and source not in settings[key]:
                    settings[key].append(source)
        elif key == "trusted-host":
            for host in value.split():
                if host not in settings[key]:
                    settings[key].append(host)
        elif key == "cert":
            settings["cert"] = value
        elif key in ("timeout", "default-timeout"):
            settings["timeout"] = value
    # The last index-url configured is the one pip uses.
    settings["index-url"] = settings["index-url"][-1:]
    return settings


def render_pip_conf(settings, constraint="/opt/ee-build/requirements.txt", cert="/opt/ee-build/ca-bundle.crt"):
    """The build-only /etc/pip.conf (removed again at the end of the build)."""
    lines = ["# Build-only (scripts/ee_stage.py); removed from the final image.", "[global]",
             "cert = %s" % cert, "constraint = %s" % constraint, "no-cache-dir = true",
             "disable-pip-version-check = true"]
    if settings.get("timeout"):
        lines.append("timeout = %s" % settings["timeout"])
    if settings["index-url"]:
        lines.append("index-url = %s" % settings["index-url"][0])
    if settings["extra-index-url"]:
        lines.append("extra-index-url = %s" % " ".join(settings["extra-index-url"]))
    if settings["trusted-host"]:
        lines.append("trusted-host = %s" % " ".join(settings["trusted-host"]))
    return "\n".join(lines) + "\n"


def ca_bundle(settings):
    """The CA bundle pip on this machine trusts: its `cert` setting, else the system default."""
    for candidate in (settings.get("cert"), ssl.get_default_verify_paths().cafile,
                      "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and os.path.isfile(candidate):
            return candidate
    raise SystemExit("ee: no CA bundle found (pip's cert setting, the system's default); set pip's `cert`")


def read_pins(path):
    """name -> version for every `name==version` line of a requirements file (names normalized)."""
    pins = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            line = line.split("#", 1)[0].strip()
            if "==" in line:
                name, version = line.split("==", 1)
                pins[normalize(name)] = version.strip()
    return pins


def normalize(name):
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


def collection_pins(requirements_yml):
    """[(namespace, name, version, file name)] from ee/requirements.yml (type: file entries)."""
    import yaml  # pylint: disable=import-outside-toplevel

    with open(requirements_yml, encoding="utf-8") as handle:
        data = yaml.safe_load(handle)
    result = []
    for entry in data.get("collections", []):
        match = COLLECTION_FILE.match(entry.get("name", ""))
        if entry.get("type") != "file" or not match:
            raise SystemExit("ee: %s: every collection is a local tarball (type: file, "
                             "name: collections/<namespace>-<name>-<version>.tar.gz), not %r" % (requirements_yml, entry))
        result.append((match.group(1), match.group(2), match.group(3), os.path.basename(entry["name"])))
    return result


def pack_installed_collection(src, dest):
    """Pack an installed collection into an artifact ansible-galaxy installs (the layout of a
    built collection tarball: MANIFEST.json, FILES.json, the files FILES.json lists).

    The PyPI `ansible` package leaves some files of each collection out (CI configs, tests),
    while its FILES.json still lists them and ansible-galaxy refuses a tarball without a listed
    file: FILES.json is cut to the files present, and MANIFEST.json's checksum of it updated.
    The files themselves are not touched (ansible-galaxy checks each one's sha256 on install)."""
    with open(os.path.join(src, "FILES.json"), encoding="utf-8") as handle:
        files_doc = json.load(handle)
    with open(os.path.join(src, "MANIFEST.json"), encoding="utf-8") as handle:
        manifest = json.load(handle)
    present = [e for e in files_doc["files"]
               if e["name"] == "." or os.path.lexists(os.path.join(src, e["name"]))]
    files_bytes = json.dumps(dict(files_doc, files=present), indent=4).encode("utf-8")
    manifest["file_manifest_file"]["chksum_sha256"] = hashlib.sha256(files_bytes).hexdigest()
    manifest_bytes = json.dumps(manifest, indent=4).encode("utf-8")
    with tarfile.open(dest, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for member, data in (("MANIFEST.json", manifest_bytes), ("FILES.json", files_bytes)):
            info = tarfile.TarInfo(member)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        for entry in present:
            if entry["name"] != ".":
                tar.add(os.path.join(src, entry["name"]), arcname=entry["name"], recursive=False)
    return len(files_doc["files"]) - len(present)


def artifact_digest(tarball):
    """A content hash of a collection artifact: its MANIFEST.json and FILES.json (which carries
    every file's sha256); the same collection packed twice hashes the same."""
    digest = hashlib.sha256()
    with tarfile.open(tarball, "r:gz") as tar:
        for member in ("MANIFEST.json", "FILES.json"):
            digest.update(tar.extractfile(member).read())
    return digest.hexdigest()


def artifact_version(tarball):
    with tarfile.open(tarball, "r:gz") as tar:
        info = json.load(io.TextIOWrapper(tar.extractfile("MANIFEST.json"), encoding="utf-8"))["collection_info"]
    return info["namespace"], info["name"], info["version"]


def stage_collections(requirements_yml, tarball, site_packages, out_dir):
    """Put every collection of ee/requirements.yml into out_dir; refuse a version mismatch."""
    os.makedirs(out_dir, exist_ok=True)
    for stale in os.listdir(out_dir):
        os.unlink(os.path.join(out_dir, stale))
    for namespace, name, version, filename in collection_pins(requirements_yml):
        dest = os.path.join(out_dir, filename)
        if (namespace, name) == ("kvcache", "offload"):
            found = artifact_version(tarball)
            if found != (namespace, name, version):
                raise SystemExit("ee: %s is %s.%s %s; ee/requirements.yml pins %s.%s %s: set the file name "
                                 "there to galaxy.yml's version" % (tarball, found[0], found[1], found[2],
                                                                    namespace, name, version))
            shutil.copyfile(tarball, dest)
            continue
        src = os.path.join(site_packages, "ansible_collections", namespace, name)
        manifest = os.path.join(src, "MANIFEST.json")
        if not os.path.isfile(manifest):
            raise SystemExit("ee: %s.%s is not in the `ansible` package of %s; install requirements-dev.txt "
                             "(make venv)" % (namespace, name, site_packages))
        with open(manifest, encoding="utf-8") as handle:
            found = json.load(handle)["collection_info"]["version"]
        if found != version:
            fix = "rename its entry to collections/%s-%s-%s.tar.gz" % (namespace, name, found)
            raise SystemExit("ee: the `ansible` package holds %s.%s %s, ee/requirements.yml pins %s: %s"
                             % (namespace, name, found, version, fix))
        pack_installed_collection(src, dest)


def stage_pip(settings, lock_file, out_dir, pip_wheel_dir=None):
    """pip.conf, ca-bundle.crt and pip's pinned wheel into out_dir."""
    os.makedirs(out_dir, exist_ok=True)
    for stale in os.listdir(out_dir):
        os.unlink(os.path.join(out_dir, stale))
    with open(os.path.join(out_dir, "pip.conf"), "w", encoding="utf-8") as handle:
        handle.write(render_pip_conf(settings))
    shutil.copyfile(ca_bundle(settings), os.path.join(out_dir, "ca-bundle.crt"))
    pip_version = read_pins(lock_file).get("pip")
    if not pip_version:
        raise SystemExit("ee: %s pins no pip==<version>" % lock_file)
    cache = pip_wheel_dir or os.path.join(ROOT, "build", "ee", "pip-wheel")
    wheel = "pip-%s-py3-none-any.whl" % pip_version
    if not os.path.isfile(os.path.join(cache, wheel)):
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        "--dest", cache, "pip==%s" % pip_version], check=True)
    shutil.copyfile(os.path.join(cache, wheel), os.path.join(out_dir, wheel))


def inputs_hash(paths, extra=()):
    """sha256 over the files (a tarball by its artifact_digest) and extra strings, sorted by path."""
    digest = hashlib.sha256()
    files = []
    for path in paths:
        if os.path.isdir(path):
            for base, _dirs, names in os.walk(path):
                files.extend(os.path.join(base, n) for n in names)
        else:
            files.append(path)
    for path in sorted(files):
        digest.update(os.path.relpath(path, ROOT).encode() + b"\0")
        if path.endswith(".tar.gz") and os.path.basename(os.path.dirname(path)) == "collections":
            digest.update(artifact_digest(path).encode())
        else:
            with open(path, "rb") as handle:
                digest.update(hashlib.sha256(handle.read()).hexdigest().encode())
    for value in extra:
        digest.update(b"\0" + value.encode())
    return digest.hexdigest()


def pip_config_text():
    return subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                          timeout=60, check=False).stdout


def lock(in_file, out_file):
    """Resolve in_file (pip --dry-run --report, nothing installed) and write every pin."""
    report_path = os.path.join(ROOT, "build", "ee", "lock-report.json")
    os.makedirs(os.path.dirname(report_path), exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
                    "--only-binary=:all:", "--report", report_path, "-r", in_file], check=True)
    with open(report_path, encoding="utf-8") as handle:
        report = json.load(handle)
    direct = set(read_pins(in_file))
    with open(in_file, encoding="utf-8") as handle:
        for line in handle:
            line = line.split("#", 1)[0].strip()
            if line:
                direct.add(normalize(re.split(r"[=<>!~\[; ]", line, maxsplit=1)[0]))
    pins = sorted(((i["metadata"]["name"], i["metadata"]["version"]) for i in report["install"]),
                  key=lambda p: normalize(p[0]))
    if not any(normalize(n) == "pip" for n, _v in pins):
        pins = sorted(pins + [("pip", read_pins(in_file)["pip"])], key=lambda p: normalize(p[0]))
    lines = ["# The execution environment's Python packages, every one pinned: written by",
             "# `scripts/ee.sh --lock` from ee/requirements.in (the direct requirements). ansible-builder",
             "# installs this file and every pip run of the build is constrained by it, so the Python",
             "# requirements the collections declare resolve to these pins (docs/execution-environment.md).",
             ""]
    lines += ["%s==%s%s" % (n, v, "" if normalize(n) in direct else "  # via a dependency") for n, v in pins]
    with open(out_file, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    stage = sub.add_parser("stage")
    stage.add_argument("--tarball", required=True)
    stage.add_argument("--out", default=os.path.join(ROOT, "build", "ee", "stage"))
    stage.add_argument("--base-image-id", default="")
    sub.add_parser("lock")
    args = parser.parse_args(argv)
    ee_dir = os.path.join(ROOT, "ee")
    if args.command == "lock":
        lock(os.path.join(ee_dir, "requirements.in"), os.path.join(ee_dir, "requirements.txt"))
        return 0
    site_packages = sysconfig.get_paths()["purelib"]
    stage_collections(os.path.join(ee_dir, "requirements.yml"), args.tarball, site_packages,
                      os.path.join(args.out, "collections"))
    stage_pip(parse_pip_config(pip_config_text()), os.path.join(ee_dir, "requirements.txt"),
              os.path.join(args.out, "pip"))
    inputs = [os.path.join(ROOT, "execution-environment.yml"), ee_dir, os.path.join(HERE, "ee.sh"),
              os.path.abspath(__file__), args.out]
    print(inputs_hash(inputs, extra=[args.base_image_id])[:12])
    return 0


if __name__ == "__main__":
    sys.exit(main())
