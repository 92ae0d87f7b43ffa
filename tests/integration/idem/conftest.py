"""A proxy with idempotency rules on fixed queue names, and its data dir."""
import os
import shutil
import tempfile

import pika
import pytest

import support
# The suite's tests import the runner from here.
from rulesproxy import Proxy  # noqa: F401


QUEUES = {
    "acemq-idem-id": '"key": "message-id"',
    "acemq-idem-hdr": '"key": "header:x-request-id"',
    "acemq-idem-json": '"key": "json:order.id"',
    # five asked for beyond any consumer's prefetch (test_surplus.py)
    "acemq-idem-ahead": '"key": "message-id", "prefetch_ahead": 5',
}


@pytest.fixture(scope="session")
def dirs():
    top = tempfile.mkdtemp(prefix="acemq-idem-")
    rules = os.path.join(top, "rules")
    os.makedirs(rules)
    entries = ", ".join('{"queue": "%s", %s, "lease_s": 3, "retention_s": 600, '
                        '"in_progress_delay_s": 1}' % (q, k) for q, k in QUEUES.items())
    with open(os.path.join(rules, "root.json"), "w") as f:
        f.write('{"vhost": "/", "idempotency": [%s]}' % entries)
    yield {"top": top, "rules": rules, "data": os.path.join(top, "data")}
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="session")
def proxy(dirs):
    support.ensure_rabbitmq(60)
    p = Proxy(dirs["rules"], dirs["data"])
    yield p
    rc = p.stop()
    text = p.stderr()
    assert rc == 0, text[-3000:]
    assert "AddressSanitizer" not in text and "runtime error" not in text, text[-3000:]


@pytest.fixture
def fresh():
    """The rule queues, declared and empty."""
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
    ch = c.channel()
    for q in QUEUES:
        ch.queue_declare(q)
        ch.queue_purge(q)
    c.close()
    return list(QUEUES)
