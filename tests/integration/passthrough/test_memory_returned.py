"""Memory given back after a burst of closes: 5,000 connections (full
handshake and one channel each, held at once) open and close through the
proxy, twice. Once they are gone the proxy hands the heap they freed back
to the system (malloc_trim when a worker has no session left, after
libevent's per-descriptor entries were made ahead of the sessions, so they
do not pin the sessions' pages): RSS comes back within 2x of where it
started, gives back most of what the burst took, and the second round does
not grow it."""
import json
import os
import re
import resource
import subprocess
import time
import urllib.request

import pytest

import support
from conftest import PROXY_BIN, ProxyProcess

BENCH = os.path.join(os.path.dirname(PROXY_BIN), "..", "bench", "acemq-bench")
SANITIZED = os.environ.get("ACEMQ_IT_SANITIZED") == "1"
N = 5000
MIB = 1 << 20


def rss(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS for %d" % pid)


def stats(admin):
    with urllib.request.urlopen("http://127.0.0.1:%d/stats" % admin, timeout=5) as r:
        return json.load(r)


def broker_fd_limit():
    out = support.rabbitmqctl("status", check=False).stdout
    m = re.search(r"Total: \d+, limit: (\d+)", out)
    return int(m.group(1)) if m else 0


def settle(p, admin, trims_before):
    """Wait until every session is gone and a trim ran after that, then
    until RSS stops falling; returns it. (A build without the heap_trims
    counter, to see the test fail, waits for RSS alone.)"""
    assert support.wait_until(lambda: stats(admin)["connections_open"] == 0, 60)
    assert support.wait_until(lambda: stats(admin).get("heap_trims", 1) > trims_before, 10), \
        "no heap trim after the closes"
    last = rss(p.proc.pid)
    for _ in range(20):
        time.sleep(0.25)
        now = rss(p.proc.pid)
        if now >= last:
            break
        last = now
    return rss(p.proc.pid)


def burst(p):
    """N connections opened at once and held, then all closed (acemq-bench's
    idle mode); returns the proxy's RSS while they were open."""
    out = subprocess.run([BENCH, "--port", str(p.listen_port), "--idle-connections", str(N),
                          "--idle-wait", "1", "--pid", str(p.proc.pid), "--quiet"],
                         capture_output=True, text=True, timeout=600)
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT")]
    assert line, out.stderr[-2000:]
    r = dict(kv.split("=", 1) for kv in line[0].split()[1:])
    assert int(r["opened"]) == N and int(r["errors"]) == 0, (r, out.stderr[-2000:])
    return int(r["rss0_kb"]) * 1024


@pytest.mark.skipif(SANITIZED, reason="the sanitizers' allocator keeps freed memory itself")
def test_heap_is_given_back_after_a_burst_of_closes(rabbitmq):
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    limit = broker_fd_limit()
    if hard < 2 * N + 300 or (limit and limit < N + 200):
        pytest.skip("file limits too low for %d connections: %d, broker %d" % (N, hard, limit))
    admin = support.free_port()
    p = ProxyProcess("acemq-proxy-trim", PROXY_BIN, support.BROKER_PORT, log_level="warning",
                     extra_args=["--admin", "127.0.0.1:%d" % admin, "--workers", "2",
                                 "--max-connections", str(N + 100)])
    p.start()
    try:
        assert support.wait_until(lambda: support.port_accepts(admin), 10)
        # Where it starts: after one connection came and went.
        c = support.connect(p.listen_port)
        c.close()
        start = settle(p, admin, 0)
        results = []
        for _ in range(2):
            trims = stats(admin).get("heap_trims", 0)
            peak = burst(p)
            after = settle(p, admin, trims)
            results.append((peak, after))
        print("\nproxy RSS: start %.1f MB; round 1 %.1f MB open, %.1f MB after; "
              "round 2 %.1f MB open, %.1f MB after"
              % ((start / MIB,) + tuple(v / MIB for r in results for v in r)))
        (peak1, after1), (peak2, after2) = results
        # Most of what the burst took is given back...
        assert after1 - start < (peak1 - start) / 2, (start, peak1, after1)
        # ...RSS is back within 2x of where it started...
        assert after1 < 2 * start and after2 < 2 * start, (start, after1, after2)
        # ...and the second round does not grow it.
        assert peak2 < peak1 + 2 * MIB and after2 < after1 + 2 * MIB, results
        assert p.proc.poll() is None
    finally:
        p.stop()
