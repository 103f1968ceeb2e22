# -*- coding: utf-8 -*-
# Copyright: kvcache.offload contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the shared KV tier holds: list an S3 bucket (ListObjectsV2 through boto3) or walk
an fs path, and group LMCache's objects per model.

LMCache 0.5.6 names objects in four ways (read from the released wheel):

in-process mode (LMCacheConnectorV1, ``CacheEngineKey.to_string`` in lmcache/utils.py):
    ``<model>@<world_size>@<worker_id>@<chunk_hash_hex>@<dtype>[@<layer_id>][@<tag>%<value>...]``
    - fs connector (storage_backend/connector/fs_connector.py): file
      ``<key with "/" replaced by "-SEP-">.data`` directly in base_path (writes go to
      ``.tmp`` first).
    - S3 connector (storage_backend/connector/s3_connector.py): object key = the key
      with "/" replaced by "_" (so the model string cannot be recovered exactly).

multiprocess mode (``lmcache server`` L2 adapters, v1/distributed/l2_adapters):
    ``<model>@<kv_rank:08x>@<object_group_id:x>@<chunk_hash_hex>[@<cache_salt>]``
    where kv_rank packs (world_size<<24)|(rank<<16)|(local_world_size<<8)|local_rank.
    - fs adapter: file ``<model "/"->"-SEP->@0x<kv_rank:08x>@...(.data)``.
    - S3 adapter: object key with the model string unchanged (slashes kept).
"""

from __future__ import annotations

import datetime
import os
import stat

try:
    import boto3
    from botocore.config import Config as BotoConfig
    from botocore import exceptions as boto_exceptions
    HAS_BOTO3 = True
    BOTO3_IMPORT_ERROR = None
except ImportError as exc:  # pragma: no cover - exercised by ansible-test sanity
    boto3 = None
    BotoConfig = None
    boto_exceptions = None
    HAS_BOTO3 = False
    BOTO3_IMPORT_ERROR = exc

SEP_FS = "-SEP-"
DATA_EXT = ".data"
TMP_EXT = ".tmp"

# LMCache's TORCH_DTYPE_TO_STR_DTYPE values (lmcache/utils.py) plus the fp8 variants.
LMCACHE_DTYPES = frozenset((
    "half", "bfloat16", "float", "double", "int8", "uint8", "int16", "int32", "int64", "bool",
    "fp8_e4m3fn", "fp8_e4m3fnuz", "fp8_e5m2", "fp8_e5m2fnuz",
))

FORMAT_INPROCESS = "inprocess"
FORMAT_MP = "mp"


class TierError(Exception):
    """A listing failure with a machine-readable kind (see tier_inventory RETURN)."""

    def __init__(self, kind, message, code=None, http_status=None):
        super(TierError, self).__init__(message)
        self.kind = kind
        self.message = message
        self.code = code
        self.http_status = http_status

    def to_dict(self):
        return {"kind": self.kind, "message": self.message, "code": self.code, "http_status": self.http_status}


def _is_hex(text):
    if not text:
        return False
    try:
        int(text, 16)
        return True
    except ValueError:
        return False


def _is_int(text):
    return text.isdigit()


def parse_object_name(name):
    """Parse one object name (an S3 key, or a file's base name) into a dict, or None.

    Returned dict: model (as stored, "-SEP-" decoded), format (inprocess|mp), world_size,
    worker_id (in-process) or kv_rank (mp), chunk_hash, dtype (in-process), layer_id.
    """
    base = name
    if base.endswith(DATA_EXT):
        base = base[:-len(DATA_EXT)]
    parts = base.split("@")
    if len(parts) < 4:
        return None
    model = parts[0].replace(SEP_FS, "/")
    if not model:
        return None
    # in-process CacheEngineKey: model@ws@worker@hash@dtype[...]
    if len(parts) >= 5 and _is_int(parts[1]) and _is_int(parts[2]) and _is_hex(parts[3]) and parts[4] in LMCACHE_DTYPES:
        layer = None
        if len(parts) >= 6 and _is_int(parts[5]):
            layer = int(parts[5])
        return {
            "model": model,
            "format": FORMAT_INPROCESS,
            "world_size": int(parts[1]),
            "worker_id": int(parts[2]),
            "chunk_hash": parts[3],
            "dtype": parts[4],
            "layer_id": layer,
        }
    # MP ObjectKey: model@kv_rank_hex@group_hex@hash_hex[@salt]
    if len(parts) in (4, 5) and _is_hex(parts[1]) and _is_hex(parts[2]) and _is_hex(parts[3]):
        kv_rank = int(parts[1], 16)
        return {
            "model": model,
            "format": FORMAT_MP,
            "world_size": (kv_rank >> 24) & 0xFF,
            "worker_id": (kv_rank >> 16) & 0xFF,
            "kv_rank": kv_rank,
            "object_group_id": int(parts[2], 16),
            "chunk_hash": parts[3],
            "dtype": None,
            "layer_id": None,
        }
    return None


def model_spellings(model):
    """The ways a model string can appear as the first field of an object name."""
    return sorted(set([model, model.replace("/", SEP_FS), model.replace("/", "_")]))


def match_model(stored, wanted_models):
    """Map a parsed model field back to one of the wanted model strings (or None)."""
    for wanted in wanted_models or ():
        if stored == wanted or stored == wanted.replace("/", "_"):
            return wanted
    return None


def _iso(epoch):
    if epoch is None:
        return None
    return datetime.datetime.fromtimestamp(epoch, tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Inventory(object):
    """Accumulates objects and produces the module's result dict."""

    def __init__(self, models=None, examples=5):
        self.models_wanted = list(models or [])
        self.examples = examples
        self.objects = 0
        self.bytes = 0
        self.newest = None
        self.oldest = None
        self.per_model = {}
        self.unrecognized = {"objects": 0, "bytes": 0, "examples": []}
        self.in_flight = {"objects": 0, "bytes": 0}

    def add(self, name, size, mtime, parse_name=None):
        """Count one object; parse_name is the part that carries the LMCache key (default: name)."""
        if name.endswith(TMP_EXT):
            self.in_flight["objects"] += 1
            self.in_flight["bytes"] += size
            return
        self.objects += 1
        self.bytes += size
        if mtime is not None:
            self.newest = mtime if self.newest is None else max(self.newest, mtime)
            self.oldest = mtime if self.oldest is None else min(self.oldest, mtime)
        parsed = parse_object_name(parse_name if parse_name is not None else name)
        if parsed is None:
            self.unrecognized["objects"] += 1
            self.unrecognized["bytes"] += size
            if len(self.unrecognized["examples"]) < self.examples:
                self.unrecognized["examples"].append(name)
            return
        model = match_model(parsed["model"], self.models_wanted) or parsed["model"]
        entry = self.per_model.get(model)
        if entry is None:
            entry = {"objects": 0, "bytes": 0, "newest_epoch": None, "formats": [], "world_sizes": [], "dtypes": [], "workers": []}
            self.per_model[model] = entry
        entry["objects"] += 1
        entry["bytes"] += size
        if mtime is not None:
            entry["newest_epoch"] = mtime if entry["newest_epoch"] is None else max(entry["newest_epoch"], mtime)
        for key, value in (("formats", parsed["format"]), ("world_sizes", parsed["world_size"]),
                           ("dtypes", parsed["dtype"]), ("workers", parsed["worker_id"])):
            if value is not None and value not in entry[key]:
                entry[key].append(value)

    def result(self):
        models = {}
        for name, entry in self.per_model.items():
            out = dict(entry)
            out["newest"] = _iso(entry["newest_epoch"])
            for key in ("formats", "world_sizes", "dtypes", "workers"):
                out[key] = sorted(out[key])
            models[name] = out
        for wanted in self.models_wanted:
            models.setdefault(wanted, {"objects": 0, "bytes": 0, "newest_epoch": None, "newest": None,
                                       "formats": [], "world_sizes": [], "dtypes": [], "workers": []})
        return {
            "objects": self.objects,
            "bytes": self.bytes,
            "newest_epoch": self.newest,
            "newest": _iso(self.newest),
            "oldest_epoch": self.oldest,
            "oldest": _iso(self.oldest),
            "models": models,
            "unrecognized": self.unrecognized,
            "in_flight": self.in_flight,
        }


def inventory_delta(current, baseline):
    """Objects/bytes added since a baseline result (negative when objects were removed)."""
    if not baseline:
        return None
    out = {
        "objects": current["objects"] - baseline.get("objects", 0),
        "bytes": current["bytes"] - baseline.get("bytes", 0),
        "newer_than_baseline": (current.get("newest_epoch") or 0) > (baseline.get("newest_epoch") or 0),
        "models": {},
    }
    base_models = baseline.get("models") or {}
    for model, entry in current["models"].items():
        base = base_models.get(model) or {}
        out["models"][model] = {
            "objects": entry["objects"] - base.get("objects", 0),
            "bytes": entry["bytes"] - base.get("bytes", 0),
        }
    return out


# --------------------------------------------------------------------------- fs


def fs_state(path):
    """Facts about the fs tier path that explain failures (missing, not a mount, read-only)."""
    state = {"path": path, "exists": os.path.exists(path), "is_dir": os.path.isdir(path),
             "is_mount": False, "read_only": None, "writable": None, "total_bytes": None, "free_bytes": None}
    if state["is_dir"]:
        state["is_mount"] = os.path.ismount(path)
        state["writable"] = os.access(path, os.W_OK | os.X_OK)
        try:
            st = os.statvfs(path)
            state["read_only"] = bool(st.f_flag & os.ST_RDONLY)
            state["total_bytes"] = st.f_blocks * st.f_frsize
            state["free_bytes"] = st.f_bavail * st.f_frsize
        except OSError:
            pass
    return state


def walk_fs(path, inventory, max_objects=None):
    """Walk path (not following symlinks) and feed every regular file to inventory.

    Returns (truncated, errors). Raises TierError when the path is missing or unreadable.
    """
    if not os.path.exists(path):
        raise TierError("missing", "path %s does not exist (is the shared volume mounted?)" % path)
    if not os.path.isdir(path):
        raise TierError("not_a_directory", "path %s is not a directory" % path)
    if not os.access(path, os.R_OK | os.X_OK):
        raise TierError("permission", "path %s is not readable" % path)
    errors = []
    seen = 0
    stack = [path]
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except OSError as exc:
            errors.append("%s: %s" % (current, exc.strerror or exc))
            continue
        for entry in sorted(entries, key=lambda e: e.name):
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as exc:
                errors.append("%s: %s" % (entry.path, exc.strerror or exc))
                continue
            if stat.S_ISDIR(st.st_mode):
                stack.append(entry.path)
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            if max_objects is not None and seen >= max_objects:
                return True, errors
            seen += 1
            # fs file names never contain "/" (LMCache writes "-SEP-"): the key is the base name.
            inventory.add(os.path.relpath(entry.path, path), st.st_size, st.st_mtime, parse_name=entry.name)
    return False, errors


# --------------------------------------------------------------------------- s3


def make_s3_client(endpoint_url=None, region=None, access_key=None, secret_key=None, session_token=None,
                   addressing_style="auto", validate_certs=True, ca_path=None,
                   connect_timeout=10.0, read_timeout=10.0, retries=2):
    """A boto3 S3 client with explicit timeouts, bounded retries and addressing style."""
    if not HAS_BOTO3:
        raise TierError("dependency", "boto3 is not installed")
    config = BotoConfig(
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        retries={"total_max_attempts": retries, "mode": "standard"},
        s3={"addressing_style": addressing_style},
        signature_version="s3v4",
    )
    verify = ca_path if (validate_certs and ca_path) else bool(validate_certs)
    session = boto3.session.Session(
        aws_access_key_id=access_key or None,
        aws_secret_access_key=secret_key or None,
        aws_session_token=session_token or None,
        region_name=region or None,
    )
    return session.client("s3", endpoint_url=endpoint_url or None, config=config, verify=verify)


AUTH_CODES = ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "AllAccessDisabled")


def classify_s3_error(exc):
    """Turn a boto3/botocore exception into a TierError."""
    if boto_exceptions is not None:
        if isinstance(exc, boto_exceptions.ClientError):
            err = exc.response.get("Error", {}) if hasattr(exc, "response") else {}
            code = err.get("Code")
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") if hasattr(exc, "response") else None
            message = err.get("Message") or str(exc)
            if code in AUTH_CODES or status == 403:
                kind = "auth"
            elif code in ("NoSuchBucket",) or status == 404:
                kind = "not_found"
            elif code in ("PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException"):
                kind = "addressing"
            else:
                kind = "s3"
            return TierError(kind, "%s%s: %s" % (code, " (HTTP %s)" % status if status else "", message),
                             code=code, http_status=status)
        if isinstance(exc, (boto_exceptions.ConnectTimeoutError, boto_exceptions.ReadTimeoutError)):
            return TierError("timeout", str(exc))
        if isinstance(exc, boto_exceptions.SSLError):
            return TierError("tls", str(exc))
        if isinstance(exc, boto_exceptions.EndpointConnectionError):
            text = str(exc)
            cause = getattr(exc, "kwargs", {}).get("error")
            detail = "%s %s" % (text, cause)
            if "Name or service not known" in detail or "nodename nor servname" in detail or "getaddrinfo" in detail \
                    or "Temporary failure in name resolution" in detail:
                return TierError("dns", text)
            return TierError("connection", text)
        if isinstance(exc, boto_exceptions.NoCredentialsError):
            return TierError("auth", "no S3 credentials given or found")
        if isinstance(exc, boto_exceptions.ParamValidationError):
            return TierError("invalid", str(exc))
        if isinstance(exc, boto_exceptions.BotoCoreError):
            return TierError("s3", str(exc))
    return TierError("s3", str(exc))


def list_s3(client, bucket, inventory, prefix="", max_objects=None, page_size=1000):
    """ListObjectsV2 over the whole bucket (or prefix). Returns (truncated, pages)."""
    seen = 0
    pages = 0
    kwargs = {"Bucket": bucket, "MaxKeys": page_size}
    if prefix:
        kwargs["Prefix"] = prefix
    try:
        while True:
            resp = client.list_objects_v2(**kwargs)
            pages += 1
            for obj in resp.get("Contents", []) or []:
                if max_objects is not None and seen >= max_objects:
                    return True, pages
                seen += 1
                mtime = obj.get("LastModified")
                epoch = mtime.timestamp() if hasattr(mtime, "timestamp") else None
                inventory.add(obj["Key"], int(obj.get("Size", 0)), epoch)
            if not resp.get("IsTruncated"):
                return False, pages
            token = resp.get("NextContinuationToken")
            if not token:
                return False, pages
            kwargs["ContinuationToken"] = token
    except Exception as exc:  # botocore raises many unrelated types; classify all of them
        if isinstance(exc, TierError):
            raise
        raise classify_s3_error(exc)
