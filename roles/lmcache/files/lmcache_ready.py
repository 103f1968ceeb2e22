"""Readiness gate of the LMCache server unit (ExecStartPost of kvcache-lmcache.service).

Polls the server's health check until it answers 200, so that systemd reports the unit
started only then: the vLLM instances (After=, Requires=, PartOf= the server) start after a
server that can take their KV registration, on the first start, after a reboot and when the
rolling restart restarts the server. Exits 1 when the deadline passes (the start fails and
systemd says so), 2 on bad arguments.

Usage: lmcache_ready.py URL TIMEOUT_SECONDS
"""
import sys
import time
import urllib.error
import urllib.request


def main(argv):
    if len(argv) != 3:
        sys.stderr.write("usage: lmcache_ready.py URL TIMEOUT_SECONDS\n")
        return 2
    url, timeout = argv[1], float(argv[2])
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=min(5.0, max(0.5, deadline - time.monotonic()))) as resp:
                if resp.status == 200:
                    return 0
                last = "HTTP %d" % resp.status
        except urllib.error.HTTPError as exc:
            last = "HTTP %d" % exc.code
        except (OSError, ValueError) as exc:
            last = str(exc)
        time.sleep(1)
    sys.stderr.write("the LMCache server did not answer %s within %.0f s (last: %s)\n" % (url, timeout, last))
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
