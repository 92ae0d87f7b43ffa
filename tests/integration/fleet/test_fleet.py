"""End to end through a fleet: publishers with a dedup header and
idempotent consumers spread over two proxies by HAProxy, every message
also published a second time through the fleet (answered by publish dedup)
and a third time straight to the broker (caught by idempotency); proxy A
killed with SIGKILL and restarted mid-traffic. Every message is handled,
and a message is handled twice only if its first handling was in flight on
A when it died (the documented window of an ack in flight)."""
import threading
import time
import uuid

import pika

from conftest import QUEUE

BROKER = 5672
N_PUB, PER_PUB, N_CONS, PREFETCH = 3, 120, 4, 10


def connect(port):
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, socket_timeout=10, blocked_connection_timeout=60,
        connection_attempts=20, retry_delay=0.3))


def props(k):
    return pika.BasicProperties(message_id=k, headers={"x-deduplication-header": k})


def publisher(port, keys, errors):
    """At least once: a publish whose confirm did not come is sent again,
    on a new connection (perhaps through the other proxy)."""
    i = 0
    ch = None
    while i < len(keys):
        try:
            if ch is None:
                c = connect(port)
                ch = c.channel()
                ch.confirm_delivery()
            ch.basic_publish("", QUEUE, b"body-" + keys[i].encode(), props(keys[i]))
            i += 1
            time.sleep(0.005)
        except Exception as e:  # noqa: BLE001 - any failure: reconnect and retry
            errors.append(repr(e))
            ch = None
            time.sleep(0.2)
    try:
        c.close()
    except Exception:  # noqa: BLE001
        pass


def consumer(port, handled, lock, stop):
    while not stop.is_set():
        try:
            c = connect(port)
            ch = c.channel()
            ch.basic_qos(prefetch_count=PREFETCH)
            for m, p, body in ch.consume(QUEUE, inactivity_timeout=0.3):
                if stop.is_set():
                    break
                if m is None:
                    continue
                with lock:
                    handled.append((p.message_id, time.time()))
                time.sleep(0.002)  # the handler
                ch.basic_ack(m.delivery_tag)
            c.close()
        except Exception:  # noqa: BLE001 - the proxy died under it: reconnect
            time.sleep(0.2)


def depth():
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", BROKER))
    n = c.channel().queue_declare(QUEUE, passive=True).method.message_count
    c.close()
    return n


def test_fleet_kill_and_restart_mid_traffic(fleet):
    lb, a = fleet["lb"], fleet["a"]
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", BROKER))
    c.channel().queue_declare(QUEUE)
    c.channel().queue_purge(QUEUE)
    c.close()
    keys = [[uuid.uuid4().hex for _ in range(PER_PUB)] for _ in range(N_PUB)]
    every = {k for ks in keys for k in ks}
    handled, lock, stop, errors = [], threading.Lock(), threading.Event(), []
    consumers = [threading.Thread(target=consumer, args=(lb.port, handled, lock, stop))
                 for _ in range(N_CONS)]
    for t in consumers:
        t.start()
    pubs = [threading.Thread(target=publisher, args=(lb.port, ks, errors)) for ks in keys]
    # The same values again through the fleet (publish dedup answers them)...
    pubs += [threading.Thread(target=publisher, args=(lb.port, ks, errors)) for ks in keys]
    for t in pubs:
        t.start()
    time.sleep(1.0)
    killed = time.time()
    a.proxy.kill9()
    time.sleep(1.0)
    a.proxy.start()
    for t in pubs:
        t.join(120)
    # ... and once more straight to the broker (idempotency catches them).
    direct = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", BROKER))
    ch = direct.channel()
    ch.confirm_delivery()
    for k in sorted(every):
        ch.basic_publish("", QUEUE, b"direct", props(k))
    direct.close()
    deadline = time.time() + 90
    while time.time() < deadline:
        with lock:
            seen = {k for k, _ in handled}
        if seen >= every and depth() == 0:
            break
        time.sleep(0.5)
    time.sleep(2)  # anything late
    stop.set()
    for t in consumers:
        t.join(30)
    first = {}
    dups = []
    for k, at in handled:
        if k in first:
            dups.append(k)
        else:
            first[k] = at
    assert set(first) == every, "lost: %d" % len(every - set(first))
    # A second handling only for what was in flight when A died.
    late = [k for k in dups if first[k] > killed + 0.5]
    assert late == [], late[:5]
    assert len(dups) <= N_CONS * PREFETCH, len(dups)
    assert depth() == 0
    print("fleet: %d messages, %d handled twice (in flight at the kill), %d publisher "
          "retries" % (len(every), len(dups), len(errors)))
