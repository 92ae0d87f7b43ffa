"""A proxy whose rules pool the broker connections of three vhosts, with
an admin endpoint; the vhosts and a user of the suite's own."""
import os
import shutil
import tempfile
import urllib.request

import pytest

import support
from rulesproxy import Proxy

VHOST = "acemq-pool"          # max_connections 2
VHOST_ONE = "acemq-pool-one"  # max_connections 1: every client on one broker connection
VHOST_TTL = "acemq-pool-ttl"  # auth_ttl_s 1
VHOST_FULL = "acemq-pool-full"  # one broker connection of two channels
USER = "acemq-pool-user"


@pytest.fixture(scope="session")
def pooled():
    support.ensure_rabbitmq(60)
    for v in (VHOST, VHOST_ONE, VHOST_TTL, VHOST_FULL):
        support.rabbitmqctl("add_vhost", v, check=False)
        support.rabbitmqctl("set_permissions", "-p", v, "guest", ".*", ".*", ".*")
    top = tempfile.mkdtemp(prefix="acemq-pool-")
    rules = os.path.join(top, "rules")
    os.makedirs(rules)
    for name, vhost, pool in (
            ("pool", VHOST, '{"max_connections": 2}'),
            # auth_ttl_s long on the one-connection vhosts: a credential check
            # at the bound opens a short extra connection, and these tests
            # count the broker's connections.
            ("one", VHOST_ONE, '{"max_connections": 1, "idle_s": 5, "auth_ttl_s": 3600}'),
            ("ttl", VHOST_TTL, '{"max_connections": 2, "auth_ttl_s": 1}'),
            ("full", VHOST_FULL, '{"max_connections": 1, "max_channels_per_connection": 2, '
                                 '"idle_s": 2, "auth_ttl_s": 3600}')):
        with open(os.path.join(rules, name + ".json"), "w") as f:
            f.write('{"vhost": "%s", "pool": %s}' % (vhost, pool))
    admin = support.free_port()
    # Clients waiting for a full pool are refused after the handshake
    # timeout: 8 s here (a broker takes about 3 s to refuse a wrong password).
    p = Proxy(rules, os.path.join(top, "data"), ["--admin", "127.0.0.1:%d" % admin,
                                                 "--handshake-timeout-ms", "8000"])
    p.admin = admin
    yield p
    rc = p.stop()
    text = p.stderr()
    shutil.rmtree(top, ignore_errors=True)
    assert rc == 0, text[-3000:]
    assert "AddressSanitizer" not in text and "runtime error" not in text, text[-3000:]


def admin_get(p, path):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (p.admin, path), timeout=10) as r:
        return r.read().decode()


def metric(p, name):
    total = 0.0
    for line in admin_get(p, "/metrics").splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if key == name:
            total += float(value)
    return total


def broker_connections(vhost):
    """The broker's connections on vhost, as rabbitmqctl lists them."""
    out = support.rabbitmqctl("list_connections", "vhost", "--no-table-headers").stdout
    return sum(1 for line in out.splitlines() if line.strip() == vhost)
