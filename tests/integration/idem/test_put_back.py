"""The put-back of an in-progress delivery over the proxy's own connection:
on a quorum queue with x-delivery-limit 1, a duplicate that waits for the
first copy's handler is republished rather than requeued, so it spends no
delivery attempt and is not dead-lettered; without the proxy's credentials
the fallback (nack with requeue) does spend them, as the docs say."""
import json
import os
import shutil
import tempfile
import time
import urllib.request
import uuid

import pika
import pytest

from conftest import Proxy, support

QQ = "acemq-idem-quorum"
DLQ = "acemq-idem-quorum-dead"


def rules_dir():
    d = tempfile.mkdtemp(prefix="acemq-idem-qq-")
    with open(os.path.join(d, "root.json"), "w") as f:
        f.write('{"vhost": "/", "idempotency": [{"queue": "%s", "key": "message-id", '
                '"lease_s": 60, "retention_s": 600, "in_progress_delay_s": 1}]}' % QQ)
    return d


def direct():
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))


def quorum_queue():
    c = direct()
    ch = c.channel()
    ch.queue_delete(QQ)
    ch.queue_delete(DLQ)
    ch.queue_declare(DLQ, durable=True)
    ch.queue_declare(QQ, durable=True, arguments={
        "x-queue-type": "quorum", "x-delivery-limit": 1,
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": DLQ})
    ch.confirm_delivery()
    return c, ch


def depth(ch, q):
    return ch.queue_declare(q, passive=True).method.message_count


def scenario(port):
    """Two copies of one key: the first held unacknowledged by one consumer
    for about 5 s while another consumer keeps meeting the second copy.
    Returns (what the second consumer saw, dead-lettered count, stats)."""
    c, ch = quorum_queue()
    k = uuid.uuid4().hex
    for body in (b"first", b"second"):
        ch.basic_publish("", QQ, body, pika.BasicProperties(message_id=k, delivery_mode=2))
    a = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ach = a.channel()
    first = None
    for _ in range(100):
        first = ach.basic_get(QQ, auto_ack=False)
        if first[0]:
            break
        time.sleep(0.05)
    assert first[2] == b"first"
    b = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    bch = b.channel()
    bch.basic_qos(prefetch_count=1)
    seen = []
    bch.basic_consume(QQ, lambda c_, m, p, body: (seen.append(body), c_.basic_ack(m.delivery_tag)))
    deadline = time.time() + 5
    while time.time() < deadline:
        b.process_data_events(0.1)
        a.process_data_events(0)
    ach.basic_ack(first[0].delivery_tag)
    deadline = time.time() + 3
    while time.time() < deadline:
        b.process_data_events(0.1)
    b.close()
    a.close()
    dead = depth(ch, DLQ)
    left = depth(ch, QQ)
    ch.queue_delete(QQ)
    ch.queue_delete(DLQ)
    c.close()
    return seen, dead, left


def queue_stats(p):
    with urllib.request.urlopen("http://127.0.0.1:%d/stats" % p.admin, timeout=10) as r:
        rows = json.loads(r.read())["queues"]
    return [q for q in rows if q["vhost"] == "/" and q["queue"] == QQ][0]


@pytest.fixture
def engine_proxy():
    rules = rules_dir()
    data = tempfile.mkdtemp(prefix="acemq-idem-qq-data-")
    admin = support.free_port()
    p = Proxy(rules, data, ["--engine-user", "guest", "--engine-password", "guest",
                            "--admin", "127.0.0.1:%d" % admin])
    p.admin = admin
    yield p
    rc = p.stop()
    text = p.stderr()
    assert rc == 0, text[-3000:]
    assert "AddressSanitizer" not in text and "runtime error" not in text, text[-3000:]
    shutil.rmtree(rules, ignore_errors=True)
    shutil.rmtree(data, ignore_errors=True)


@pytest.fixture
def plain_proxy():
    rules = rules_dir()
    data = tempfile.mkdtemp(prefix="acemq-idem-qq-data-")
    admin = support.free_port()
    p = Proxy(rules, data, ["--admin", "127.0.0.1:%d" % admin])
    p.admin = admin
    yield p
    assert p.stop() == 0
    shutil.rmtree(rules, ignore_errors=True)
    shutil.rmtree(data, ignore_errors=True)


def test_put_back_spends_no_delivery_attempt(engine_proxy):
    support.ensure_rabbitmq(60)
    seen, dead, left = scenario(engine_proxy.port)
    # The second copy was never handed to the second consumer (in progress,
    # then a duplicate once the first was acknowledged), never
    # dead-lettered, and is gone.
    assert seen == []
    assert dead == 0
    assert left == 0
    log = engine_proxy.stderr()
    assert "engine: vhost /: connected as guest" in log
    st = queue_stats(engine_proxy)
    assert st["claimed"] == 1
    assert st["in_progress"] >= 1
    assert st["put_back"] >= 1 and st["requeued"] == 0
    assert st["duplicate"] >= 1


def test_requeue_fallback_spends_them(plain_proxy):
    """Without engine credentials the put-back is a nack with requeue: on a
    quorum queue each one counts against x-delivery-limit."""
    support.ensure_rabbitmq(60)
    seen, dead, left = scenario(plain_proxy.port)
    assert seen == []
    assert dead == 1
    st = queue_stats(plain_proxy)
    assert st["requeued"] >= 1 and st["put_back"] == 0
