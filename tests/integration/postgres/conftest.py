"""Proxies that keep idempotency keys and publish-dedup windows in one
PostgreSQL database: a throwaway cluster of the suite's own, and proxies
with different data dirs (different "hosts") sharing it."""
import os
import shutil
import tempfile
import urllib.request

import pika
import pytest

import pgcluster
import support
# The suite's tests import the runner from here.
from rulesproxy import Proxy  # noqa: F401

IDEM_Q = "acemq-pg-idem"
DEDUP_Q = "acemq-pg.dedup"
PASSWORD = "pg-sekrit-do-not-show"
RULES = ('{"vhost": "/", '
         '"idempotency": [{"queue": "%s", "key": "message-id", "lease_s": 3, '
         '"retention_s": 600, "in_progress_delay_s": 1, "store": {"type": "postgresql"}}], '
         '"dedup_publish": {"match": [{"exchange": "", "routing_key": "acemq-pg.#"}], '
         '"window_s": 600, "store": {"type": "postgresql"}}}' % IDEM_Q)


def write_rules(top):
    rules = os.path.join(top, "rules")
    os.makedirs(rules, exist_ok=True)
    with open(os.path.join(rules, "root.json"), "w") as f:
        f.write(RULES)
    return rules


class Host:
    """A proxy with a data dir and an admin port of its own, on url."""

    def __init__(self, top, name, url, timeout_ms=2000):
        self.dir = os.path.join(top, name)
        os.makedirs(self.dir, exist_ok=True)
        self.admin = support.free_port()
        self.url = url
        self.timeout_ms = timeout_ms
        rules = write_rules(self.dir)
        self.proxy = Proxy(rules, os.path.join(self.dir, "data"),
                           extra=["--admin", "127.0.0.1:%d" % self.admin,
                                  "--postgres-url", url,
                                  "--postgres-timeout-ms", str(timeout_ms),
                                  "--purge-interval-s", "1"])

    @property
    def port(self):
        return self.proxy.port

    def get(self, path):
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d%s" % (self.admin, path),
                                        timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def metric(self, name):
        """The sum of a metric's samples (name with its labels, or without)."""
        total = 0.0
        for line in self.get("/metrics")[1].splitlines():
            if line.startswith("#"):
                continue
            key, _, value = line.rpartition(" ")
            if key == name or key.split("{")[0] == name and "{" not in name:
                total += float(value)
        return total

    def stop(self):
        rc = self.proxy.stop()
        text = self.proxy.stderr()
        assert rc == 0, text[-3000:]
        assert "AddressSanitizer" not in text and "runtime error" not in text, text[-3000:]
        assert PASSWORD not in text
        return text


@pytest.fixture(scope="session")
def pg():
    if not pgcluster.available():
        pytest.skip("PostgreSQL's initdb (Debian's postgresql package) and root are needed")
    c = pgcluster.Cluster()
    yield c
    c.destroy()


@pytest.fixture(scope="session")
def top():
    d = tempfile.mkdtemp(prefix="acemq-pg-it-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def pair(pg, top):
    """Proxies A and B: two hosts, one database."""
    support.ensure_rabbitmq(60)
    url = pg.url_with_password(PASSWORD)
    a = Host(top, "a", url)
    b = Host(top, "b", url)
    yield a, b
    a.stop()
    b.stop()


@pytest.fixture
def fresh():
    """The queues, declared and empty."""
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
    ch = c.channel()
    for q in (IDEM_Q, DEDUP_Q):
        ch.queue_declare(q)
        ch.queue_purge(q)
    c.close()
