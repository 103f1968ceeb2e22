# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""LMCache's S3 L2 adapter with a circuit breaker that closes again (issue #40).

Installed by the lmcache role on the s3 tier (lmcache_s3_retry_after_seconds > 0) and loaded by
the node's LMCache server through LMCache's own plugin adapter:
  --l2-adapter '{"type": "plugin", "module_path": "kvcache_s3_l2", "class_name": "RecoveringS3L2Adapter",
                 "adapter_params": {<the s3 adapter's keys>, "retry_after_seconds": 30}}'

Why: LMCache 0.5.6's S3L2Adapter (lmcache/v1/distributed/l2_adapters/s3_l2_adapter.py) sets
`_connection_disabled` after 3 consecutive connection errors and nothing ever clears it: a
StorageGRID outage of 15-25 s turns the shared tier off on every node until each LMCache server
(and with it every engine) restarts. The threshold is a class attribute and unknown adapter keys
are ignored, so no setting changes it (docs/notes/lmcache-s3-recovery.md, measured).

Here the breaker half-opens: `retry_after_seconds` after it tripped, the next store, lookup or
load goes to S3 again with the failure count one below the threshold. One more connection error
trips it again (and the wait starts over); one success closes it. While it is open, requests fail
at once without touching S3, as LMCache's own adapter does. Both transitions are logged
(journalctl -u kvcache-lmcache).

It subclasses the adapter of the pinned LMCache and uses its private state
(_connection_disabled, _connection_failures, _lock, _record_connection_outcome): the first
construction checks that they are all there and refuses to start otherwise, naming the fix.
"""

import logging
import time

from lmcache.v1.distributed.l2_adapters.s3_l2_adapter import S3L2Adapter, S3L2AdapterConfig

LOG = logging.getLogger("kvcache_s3_l2")
_REQUIRED = ("_connection_disabled", "_connection_failures", "_lock")


class RecoveringS3L2AdapterConfig(S3L2AdapterConfig):
    """The s3 adapter's settings plus retry_after_seconds (LMCache's plugin factory finds this class
    by the adapter class's name + "Config")."""

    retry_after_seconds = 30.0

    @classmethod
    def from_dict(cls, d):
        retry = d.get("retry_after_seconds", cls.retry_after_seconds)
        if not isinstance(retry, (int, float)) or isinstance(retry, bool) or retry <= 0:
            raise ValueError("retry_after_seconds must be a positive number (lmcache_s3_retry_after_seconds), got %r"
                             % (retry,))
        cfg = super().from_dict({k: v for k, v in d.items() if k != "retry_after_seconds"})
        cfg.retry_after_seconds = float(retry)
        return cfg


class RecoveringS3L2Adapter(S3L2Adapter):
    """S3L2Adapter whose circuit breaker half-opens retry_after_seconds after it tripped."""

    def __init__(self, config, **_kwargs):
        super().__init__(config)
        missing = [name for name in _REQUIRED if not hasattr(self, name)]
        if missing or not hasattr(S3L2Adapter, "_record_connection_outcome") \
                or not hasattr(S3L2Adapter, "max_connection_failures"):
            raise RuntimeError(
                "kvcache_s3_l2: this LMCache's S3L2Adapter has no %s: the half-open breaker was written for "
                "LMCache 0.5.6. Fix: set lmcache_s3_retry_after_seconds to 0 (LMCache's own adapter) or pin "
                "LMCache 0.5.6 (inference_env)." % ", ".join(missing or ["_record_connection_outcome"]))
        self._retry_after = float(getattr(config, "retry_after_seconds", RecoveringS3L2AdapterConfig.retry_after_seconds))
        self._tripped_at = None

    def _record_connection_outcome(self, error_msg):
        super()._record_connection_outcome(error_msg)
        with self._lock:
            if self._connection_disabled and (self._tripped_at is None or self._tripped_at == -1.0):
                self._tripped_at = time.monotonic()
                LOG.warning("kvcache_s3_l2: S3 unreachable (%s consecutive connection errors); requests fail at "
                            "once, S3 is tried again in %.0f s", self._connection_failures, self._retry_after)
            elif not self._connection_disabled and error_msg is None and self._tripped_at == -1.0:
                self._tripped_at = None
                LOG.warning("kvcache_s3_l2: S3 answers again; the breaker is closed")

    def _half_open(self):
        with self._lock:
            if (self._connection_disabled and self._tripped_at is not None and self._tripped_at >= 0
                    and time.monotonic() - self._tripped_at >= self._retry_after):
                self._connection_disabled = False
                self._connection_failures = self.max_connection_failures - 1
                # -1: half-open; the next success logs that the breaker closed
                self._tripped_at = -1.0
                LOG.warning("kvcache_s3_l2: trying S3 again (half-open): one more connection error opens the "
                            "breaker for another %.0f s", self._retry_after)

    def submit_store_task(self, keys, objects):
        self._half_open()
        return super().submit_store_task(keys, objects)

    def submit_lookup_and_lock_task(self, keys, group_layout_descs):
        self._half_open()
        return super().submit_lookup_and_lock_task(keys, group_layout_descs)

    def submit_load_task(self, keys, objects):
        self._half_open()
        return super().submit_load_task(keys, objects)

    def report_status(self):
        status = super().report_status()
        status["retry_after_seconds"] = self._retry_after
        status["half_open"] = self._tripped_at == -1.0
        return status
