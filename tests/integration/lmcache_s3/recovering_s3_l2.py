# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""PROTOTYPE for issue #40 (docs/notes/lmcache-s3-recovery.md), not shipped: LMCache 0.5.6's S3 L2
adapter with a half-open circuit breaker, loadable through LMCache's own plugin adapter
(--l2-adapter '{"type": "plugin", "module_path": "recovering_s3_l2", "class_name":
"RecoveringS3L2Adapter", "adapter_params": {<the s3 adapter's keys>, "retry_after_seconds": 30}}').

LMCache 0.5.6 (lmcache/v1/distributed/l2_adapters/s3_l2_adapter.py) sets `_connection_disabled`
after 3 consecutive connection errors and never clears it. Here, `retry_after_seconds` after the
breaker tripped, the next submit lets requests through again with the failure count one below the
threshold: one more connection error trips it again (and restarts the wait), one success clears it.
Uses the adapter's private state, so it is tied to the pinned LMCache version.
"""

import time

from lmcache.v1.distributed.l2_adapters.s3_l2_adapter import S3L2Adapter, S3L2AdapterConfig


class RecoveringS3L2AdapterConfig(S3L2AdapterConfig):
    """The s3 adapter's settings plus retry_after_seconds (found by the plugin factory by name)."""

    retry_after_seconds = 30.0

    @classmethod
    def from_dict(cls, d):
        retry = d.get("retry_after_seconds", cls.retry_after_seconds)
        if not isinstance(retry, (int, float)) or isinstance(retry, bool) or retry <= 0:
            raise ValueError("retry_after_seconds must be a positive number")
        cfg = super().from_dict({k: v for k, v in d.items() if k != "retry_after_seconds"})
        cfg.retry_after_seconds = float(retry)
        return cfg


class RecoveringS3L2Adapter(S3L2Adapter):
    """S3L2Adapter whose breaker half-opens retry_after_seconds after it tripped."""

    def __init__(self, config, **_kwargs):
        super().__init__(config)
        self._retry_after = float(getattr(config, "retry_after_seconds",
                                          RecoveringS3L2AdapterConfig.retry_after_seconds))
        self._tripped_at = None

    def _record_connection_outcome(self, error_msg):
        super()._record_connection_outcome(error_msg)
        with self._lock:
            if self._connection_disabled and self._tripped_at is None:
                self._tripped_at = time.monotonic()

    def _half_open(self):
        with self._lock:
            if (self._connection_disabled and self._tripped_at is not None
                    and time.monotonic() - self._tripped_at >= self._retry_after):
                self._connection_disabled = False
                self._connection_failures = self.max_connection_failures - 1
                self._tripped_at = None

    def submit_store_task(self, keys, objects):
        self._half_open()
        return super().submit_store_task(keys, objects)

    def submit_lookup_and_lock_task(self, keys, group_layout_descs):
        self._half_open()
        return super().submit_lookup_and_lock_task(keys, group_layout_descs)

    def submit_load_task(self, keys, objects):
        self._half_open()
        return super().submit_load_task(keys, objects)
