"""Idempotency through the real proxy with pika and a real broker: each key
is handled once, whatever the redeliveries, retries, consumers and
restarts; a consumer that dies does not poison its key."""
import json
import os
import threading
import time
import uuid

import pika

Q = "acemq-idem-id"


def publish(port, queue, items, direct=False):
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672 if direct else port))
    ch = c.channel()
    ch.confirm_delivery()
    for body, props in items:
        ch.basic_publish("", queue, body, props)
    c.close()


def mid(i):
    return pika.BasicProperties(message_id=i)


def consume_all(port, queue, idle=2.5, ack=True, no_ack=False, on_message=None):
    """Consume until idle; returns the bodies in order."""
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = c.channel()
    ch.basic_qos(prefetch_count=50)
    got = []
    for m, props, body in ch.consume(queue, auto_ack=no_ack, inactivity_timeout=idle):
        if m is None:
            break
        got.append((props.message_id, body, m.delivery_tag))
        if on_message:
            on_message(ch, m, props, body)
        elif ack and not no_ack:
            ch.basic_ack(m.delivery_tag)
    ch.cancel()
    c.close()
    return got


def depth(queue):
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
    n = c.channel().queue_declare(queue, passive=True).method.message_count
    c.close()
    return n


def test_five_publishes_handled_once(proxy, fresh):
    k = uuid.uuid4().hex
    publish(proxy.port, Q, [(b"x%d" % i, mid(k)) for i in range(5)])
    got = consume_all(proxy.port, Q)
    assert [g[:2] for g in got] == [(k, b"x0")]
    assert [g[2] for g in got] == [1]  # tags stay contiguous
    assert depth(Q) == 0


def test_nacked_first_delivery_runs_again(proxy, fresh):
    k = uuid.uuid4().hex
    publish(proxy.port, Q, [(b"n", mid(k))])
    seen = []

    def handler(ch, m, props, body):
        seen.append(body)
        if len(seen) == 1:
            ch.basic_nack(m.delivery_tag, requeue=True)
        else:
            ch.basic_ack(m.delivery_tag)

    consume_all(proxy.port, Q, on_message=handler)
    assert seen == [b"n", b"n"]
    assert depth(Q) == 0


def test_consumer_killed_mid_handler(proxy, fresh):
    k = uuid.uuid4().hex
    publish(proxy.port, Q, [(b"k", mid(k))])
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", proxy.port))
    ch = c.channel()
    m = None
    for _ in range(50):
        m = ch.basic_get(Q, auto_ack=False)
        if m[0]:
            break
        time.sleep(0.05)
    assert m[2] == b"k"
    c._impl._transport._sock.close()  # dies without an ack
    time.sleep(0.5)
    got = consume_all(proxy.port, Q)
    assert [g[1] for g in got] == [b"k"]


def test_two_consumers_interleaved_duplicates(proxy, fresh):
    keys = [uuid.uuid4().hex for _ in range(20)]
    items = [(("%s-%d" % (k, r)).encode(), mid(k)) for r in range(3) for k in keys]
    publish(proxy.port, Q, items)
    results = [[], []]

    def run(i):
        results[i] = consume_all(proxy.port, Q, idle=3)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    handled = [g[0] for r in results for g in r]
    assert sorted(handled) == sorted(keys), (len(handled), len(keys))
    assert depth(Q) == 0


def test_duplicate_while_first_unacked_is_put_back(proxy, fresh):
    """The second copy arrives while the first is unacknowledged: held, put
    back, and a duplicate once the first is acked."""
    k = uuid.uuid4().hex
    publish(proxy.port, Q, [(b"first", mid(k)), (b"second", mid(k))])
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", proxy.port))
    ch = c.channel()
    first = None
    for _ in range(50):
        first = ch.basic_get(Q, auto_ack=False)
        if first[0]:
            break
        time.sleep(0.05)
    assert first[2] == b"first"
    # The second: in progress, held, not delivered.
    assert ch.basic_get(Q, auto_ack=False)[0] is None
    time.sleep(1.5)  # put back after in_progress_delay_s
    ch.basic_ack(first[0].delivery_tag)
    time.sleep(1.5)
    got = consume_all(proxy.port, Q)
    assert got == []
    assert depth(Q) == 0
    c.close()


def test_multiple_ack_confirms_all(proxy, fresh):
    keys = [uuid.uuid4().hex for _ in range(10)]
    publish(proxy.port, Q, [(b"m", mid(k)) for k in keys])
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", proxy.port))
    ch = c.channel()
    ch.basic_qos(prefetch_count=20)
    tags = []
    for m, props, body in ch.consume(Q, inactivity_timeout=2):
        if m is None:
            break
        tags.append(m.delivery_tag)
    ch.basic_ack(tags[-1], multiple=True)
    ch.cancel()
    c.close()
    assert len(tags) == 10
    # The same keys again: all duplicates now.
    publish(proxy.port, Q, [(b"again", mid(k)) for k in keys])
    assert consume_all(proxy.port, Q) == []
    assert depth(Q) == 0


def test_basic_get_and_no_ack(proxy, fresh):
    k = uuid.uuid4().hex
    publish(proxy.port, Q, [(b"g", mid(k)), (b"g2", mid(k))])
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", proxy.port))
    ch = c.channel()
    m = None
    for _ in range(50):
        m = ch.basic_get(Q, auto_ack=True)  # no-ack: confirmed at delivery
        if m[0]:
            break
        time.sleep(0.05)
    assert m[2] == b"g"
    time.sleep(0.3)
    # The second copy is a duplicate: get-empty, and it is gone.
    assert ch.basic_get(Q, auto_ack=False)[0] is None
    c.close()
    time.sleep(0.3)
    assert depth(Q) == 0


def test_keys_from_header_and_json(proxy, fresh):
    rid = uuid.uuid4().hex
    publish(proxy.port, "acemq-idem-hdr",
            [(b"h%d" % i, pika.BasicProperties(headers={"x-request-id": rid})) for i in range(3)])
    assert [g[1] for g in consume_all(proxy.port, "acemq-idem-hdr")] == [b"h0"]
    oid = uuid.uuid4().hex
    bodies = [json.dumps({"order": {"id": oid}, "n": i}).encode() for i in range(3)]
    bodies.append(b"not json")
    publish(proxy.port, "acemq-idem-json", [(b, None) for b in bodies])
    got = [g[1] for g in consume_all(proxy.port, "acemq-idem-json")]
    assert got == [bodies[0], b"not json"]


def test_restart_keeps_confirmations_and_leases_expire(proxy, dirs, fresh):
    from conftest import Proxy
    p = Proxy(dirs["rules"], os.path.join(dirs["top"], "data-restart"))
    try:
        k1, k2 = uuid.uuid4().hex, uuid.uuid4().hex
        publish(p.port, Q, [(b"one", mid(k1))])
        assert [g[1] for g in consume_all(p.port, Q)] == [b"one"]
        # A consumer holds k2 unacked when the proxy is killed: its claim
        # outlives it, until the lease (3 s) runs out.
        publish(p.port, Q, [(b"two", mid(k2))])
        c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", p.port))
        ch = c.channel()
        for _ in range(50):
            m = ch.basic_get(Q, auto_ack=False)
            if m[0]:
                break
            time.sleep(0.05)
        assert m[2] == b"two"
        p.kill9()
        p.start()
        t0 = time.monotonic()
        # k1 confirmed before the kill: a duplicate after the restart.
        publish(p.port, Q, [(b"one again", mid(k1))])
        got = consume_all(p.port, Q, idle=5)
        assert [g[1] for g in got] == [b"two"]
        assert time.monotonic() - t0 >= 2.5  # not before the lease ran out
        assert depth(Q) == 0
    finally:
        p.stop()
