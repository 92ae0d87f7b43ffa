"""A fleet: HAProxy in TCP mode (PROXY protocol v2 towards the proxies) in
front of two proxies with data dirs of their own, one PostgreSQL (a
throwaway cluster), one S3 bucket (s3rver) for the claim check, one
RabbitMQ. Clients connect to HAProxy only."""
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request

import pytest

import pgcluster
import s3rver
import support
from rulesproxy import Proxy

QUEUE = "acemq-fleet.work"
BIG_QUEUE = "acemq-fleet-big"  # outside publish dedup's acemq-fleet.#
CLAIM_PREFIX = "fleet-claims/"
CLAIM_THRESHOLD = 65536
RULES = json.dumps({
    "vhost": "/",
    "idempotency": [{"queue": QUEUE, "key": "message-id", "lease_s": 3, "retention_s": 600,
                     "in_progress_delay_s": 1, "store": {"type": "postgresql"}}],
    "dedup_publish": {"match": [{"exchange": "", "routing_key": "acemq-fleet.#"}],
                      "window_s": 600, "store": {"type": "postgresql"}},
    "claim_check": {"match": [{"exchange": "", "routing_key": BIG_QUEUE}],
                    "threshold": CLAIM_THRESHOLD,
                    "store": {"type": "s3", "bucket": s3rver.BUCKET, "prefix": CLAIM_PREFIX}}})


class Member:
    def __init__(self, top, name, url, s3):
        self.name = name
        self.dir = os.path.join(top, name)
        rules = os.path.join(self.dir, "rules")
        os.makedirs(rules)
        with open(os.path.join(rules, "root.json"), "w") as f:
            f.write(RULES)
        self.admin = support.free_port()
        self.proxy = Proxy(rules, os.path.join(self.dir, "data"),
                           extra=["--admin", "127.0.0.1:%d" % self.admin, "--postgres-url", url,
                                  "--proxy-protocol", "1",
                                  "--s3-endpoint", "http://127.0.0.1:%d" % s3.port,
                                  "--s3-access-key", s3rver.ACCESS,
                                  "--s3-secret-key", s3rver.SECRET, "--s3-region", "us-east-1"])

    def ready(self):
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/readyz" % self.admin,
                                        timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def stats(self):
        with urllib.request.urlopen("http://127.0.0.1:%d/stats" % self.admin, timeout=10) as r:
            return json.loads(r.read())


class HAProxy:
    def __init__(self, top, members):
        self.port = support.free_port()
        cfg = os.path.join(top, "haproxy.cfg")
        servers = "\n".join(
            "\tserver %s 127.0.0.1:%d send-proxy-v2 check port %d inter 300 fall 1 rise 1"
            % (m.name, m.proxy.port, m.admin) for m in members)
        with open(cfg, "w") as f:
            f.write("""global
	maxconn 1000

defaults
	mode tcp
	timeout connect 2s
	timeout client 1h
	timeout server 1h

frontend amqp
	bind 127.0.0.1:%d
	default_backend proxies

backend proxies
	balance roundrobin
	option httpchk GET /readyz
%s
""" % (self.port, servers))
        self.log = open(os.path.join(top, "haproxy.log"), "w+")
        self.proc = subprocess.Popen([shutil.which("haproxy"), "-db", "-f", cfg],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 10
        while not support.port_accepts(self.port):
            assert self.proc.poll() is None and time.time() < deadline, "haproxy did not start"
            time.sleep(0.05)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture(scope="module")
def fleet():
    if not pgcluster.available() or shutil.which("haproxy") is None:
        pytest.skip("needs PostgreSQL's server, HAProxy and root")
    if not os.path.exists(s3rver.S3RVER):
        pytest.fail("s3rver is not installed: run docker/setup-debian "
                    "(npm ci in tests/integration/s3/node)")
    support.ensure_rabbitmq(60)
    top = tempfile.mkdtemp(prefix="acemq-fleet-")
    pg = pgcluster.Cluster()
    s3 = s3rver.S3rver()
    a = Member(top, "a", pg.url, s3)
    b = Member(top, "b", pg.url, s3)
    deadline = time.time() + 20
    while not (a.ready() and b.ready()) and time.time() < deadline:
        time.sleep(0.1)
    lb = HAProxy(top, [a, b])
    time.sleep(1)  # the first health checks
    yield {"pg": pg, "s3": s3, "a": a, "b": b, "lb": lb}
    lb.stop()
    for m in (a, b):
        rc = m.proxy.stop()
        text = m.proxy.stderr()
        assert "AddressSanitizer" not in text and "runtime error" not in text, text[-3000:]
        assert rc == 0, text[-3000:]
    pg.destroy()
    s3.close()
    shutil.rmtree(top, ignore_errors=True)
