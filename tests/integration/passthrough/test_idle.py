"""Thousands of concurrent idle connections through the proxy (full
handshake and one channel each), held at once, with the proxy's RSS per
connection reported. As many as the file limit allows, up to 5000: the
proxy holds two descriptors per client (its leg and the broker's)."""
import os
import re
import resource
import subprocess

import pytest

import support
from conftest import PROXY_BIN, ProxyProcess

BENCH = os.path.join(os.path.dirname(PROXY_BIN), "..", "bench", "acemq-bench")
SANITIZED = os.environ.get("ACEMQ_IT_SANITIZED") == "1"


def broker_fd_limit():
    out = support.rabbitmqctl("status", check=False).stdout
    m = re.search(r"Total: \d+, limit: (\d+)", out)
    return int(m.group(1)) if m else 0


def test_thousands_of_idle_connections(rabbitmq):
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    # 5000 (2000 under the sanitizers): the broker's handshakes set the pace
    n = min(2000 if SANITIZED else 5000, (hard - 300) // 2)
    limit = broker_fd_limit()
    if limit and limit < n + 200:
        # the broker must hold them too (tests/integration/broker starts it
        # with the shell's limit)
        n = limit - 200
    assert n >= 1000, "file limits too low for the test: %d, broker %d" % (hard, limit)
    p = ProxyProcess("acemq-proxy-idle", PROXY_BIN, support.BROKER_PORT,
                     extra_args=["--max-connections", str(n + 100), "--workers", "2"])
    p.start()
    try:
        out = subprocess.run([BENCH, "--port", str(p.listen_port), "--idle-connections", str(n),
                              "--idle-wait", "2", "--pid", str(p.proc.pid), "--quiet"],
                             capture_output=True, text=True, timeout=900)
        line = [x for x in out.stdout.splitlines() if x.startswith("RESULT")]
        assert line, out.stderr[-2000:]
        r = dict(kv.split("=", 1) for kv in line[0].split()[1:])
        print("\nidle: %s connections held at once through the proxy in %s s; proxy RSS "
              "%.1f -> %.1f MB, %s KB per connection%s"
              % (r["opened"], r["open_s"], int(r["rss0_before_kb"]) / 1024.0,
                 int(r["rss0_kb"]) / 1024.0, r["rss0_per_conn_kb"],
                 " (sanitized build)" if SANITIZED else ""))
        assert int(r["opened"]) == n and int(r["errors"]) == 0, (r, out.stderr[-2000:])
        assert float(r["rss0_per_conn_kb"]) < (256 if SANITIZED else 32)
        assert p.proc.poll() is None
    finally:
        p.stop()
