"""A request loop through the lab's router, for the fault and rolling-upgrade tests.

`RequestLoop` runs `streams` threads that each send one chat completion after another
(every request bounded by a timeout) until stopped, and records for every request when it
started and ended and how it ended. Tests then ask which requests failed and whether they
were in flight at a given moment.
"""
import threading
import time

from labutil import http


class RequestLoop:
    """Chat completions through `url`, in `streams` threads, `pause` seconds apart per thread."""

    def __init__(self, url, key, model, streams=2, timeout=60, max_tokens=4, pause=0.0):
        self.url = url.rstrip("/") + "/v1/chat/completions"
        self.key = key
        self.model = model
        self.streams = streams
        self.timeout = timeout
        self.max_tokens = max_tokens
        self.pause = pause
        self.records = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = []

    def _one(self, stream, number):
        body = {"model": self.model, "max_tokens": self.max_tokens,
                "messages": [{"role": "user", "content": "loop %d.%d: tell me about caches" % (stream, number)}]}
        start = time.monotonic()
        try:
            status, text = http(self.url, body, key=self.key, timeout=self.timeout)
            error = None if status == 200 else text[:200]
        except OSError as err:  # reset, refused, timed out
            status, error = None, repr(err)
        record = {"stream": stream, "start": start, "end": time.monotonic(), "status": status, "error": error}
        with self._lock:
            self.records.append(record)

    def _run(self, stream):
        number = 0
        while not self._stop.is_set():
            self._one(stream, number)
            number += 1
            if self.pause:
                self._stop.wait(self.pause)

    def start(self):
        for stream in range(self.streams):
            thread = threading.Thread(target=self._run, args=(stream,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self):
        self._stop.set()
        for thread in self._threads:
            thread.join(self.timeout + 10)
        return self

    def ok(self, since=None):
        """Successful requests (started at or after `since`, a time.monotonic() value)."""
        with self._lock:
            return [r for r in self.records if r["status"] == 200 and (since is None or r["start"] >= since)]

    def failed(self):
        with self._lock:
            return [r for r in self.records if r["status"] != 200]

    def wait_ok(self, count, since=None, timeout=120):
        """Wait until `count` requests started after `since` succeeded; True when they did."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.ok(since)) >= count:
                return True
            time.sleep(0.5)
        return False

    def summary(self):
        with self._lock:
            records = list(self.records)
        return {"sent": len(records), "ok": sum(1 for r in records if r["status"] == 200),
                "failed": [(round(r["start"], 2), round(r["end"], 2), r["status"], r["error"])
                           for r in records if r["status"] != 200]}
