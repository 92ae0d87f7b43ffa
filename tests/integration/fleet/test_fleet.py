"""End to end through a fleet: publishers with a dedup header and
idempotent consumers spread over two proxies by HAProxy, every message
also published a second time through the fleet (answered by publish dedup)
and a third time straight to the broker (caught by idempotency); proxy A
killed with SIGKILL and restarted mid-traffic. Every message is handled,
and a message is handled twice only if its first handling was in flight on
A when it died (the documented window of an ack in flight). Alongside,
256 KiB bodies go through the claim check into one S3 bucket (s3rver) and
come back through either proxy with the same bytes, across that kill too."""
import os
import threading
import time
import uuid

import pika

from conftest import BIG_QUEUE, CLAIM_PREFIX, CLAIM_THRESHOLD, QUEUE

BROKER = 5672
N_PUB, PER_PUB, N_CONS, PREFETCH = 3, 120, 4, 10
# Paced so that they go on through the kill and the restart.
N_BIG_PUB, PER_BIG_PUB, N_BIG_CONS, BIG, BIG_PAUSE = 2, 15, 2, 256 << 10, 0.2


def connect(port):
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, socket_timeout=10, blocked_connection_timeout=60,
        connection_attempts=20, retry_delay=0.3))


def props(k):
    return pika.BasicProperties(message_id=k, headers={"x-deduplication-header": k})


def publisher(port, keys, errors, queue=QUEUE, bodies=None, pause=0.005):
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
            if bodies is None:
                ch.basic_publish("", queue, b"body-" + keys[i].encode(), props(keys[i]))
            else:
                ch.basic_publish("", queue, bodies[keys[i]],
                                 pika.BasicProperties(message_id=keys[i]))
            i += 1
            time.sleep(pause)
        except Exception as e:  # noqa: BLE001 - any failure: reconnect and retry
            errors.append(repr(e))
            ch = None
            time.sleep(0.2)
    try:
        c.close()
    except Exception:  # noqa: BLE001
        pass


def consumer(port, handled, lock, stop, queue=QUEUE, bodies=None):
    """Handles what comes; with bodies, records whether each body is the
    one published under its message-id."""
    while not stop.is_set():
        try:
            c = connect(port)
            ch = c.channel()
            ch.basic_qos(prefetch_count=PREFETCH)
            for m, p, body in ch.consume(queue, inactivity_timeout=0.3):
                if stop.is_set():
                    break
                if m is None:
                    continue
                with lock:
                    if bodies is None:
                        handled.append((p.message_id, time.time()))
                    else:
                        handled.append((p.message_id, body == bodies.get(p.message_id),
                                        len(body)))
                time.sleep(0.002)  # the handler
                ch.basic_ack(m.delivery_tag)
            c.close()
        except Exception:  # noqa: BLE001 - the proxy died under it: reconnect
            time.sleep(0.2)


def depth(queue=QUEUE):
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", BROKER))
    n = c.channel().queue_declare(queue, passive=True).method.message_count
    c.close()
    return n


def bucket_objects(s3):
    """The bytes of every object under the fleet's claim prefix."""
    out = {}
    for key in s3.objects(CLAIM_PREFIX):
        with open(s3.object_path(key), "rb") as f:
            out[key] = f.read()
    return out


def test_fleet_kill_and_restart_mid_traffic(fleet):
    lb, a, s3 = fleet["lb"], fleet["a"], fleet["s3"]
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", BROKER))
    for q in (QUEUE, BIG_QUEUE):
        c.channel().queue_declare(q)
        c.channel().queue_purge(q)
    c.close()
    keys = [[uuid.uuid4().hex for _ in range(PER_PUB)] for _ in range(N_PUB)]
    every = {k for ks in keys for k in ks}
    handled, lock, stop, errors = [], threading.Lock(), threading.Event(), []
    consumers = [threading.Thread(target=consumer, args=(lb.port, handled, lock, stop))
                 for _ in range(N_CONS)]
    # Claim-checked bodies over the S3 store, through either proxy.
    big_keys = [[uuid.uuid4().hex for _ in range(PER_BIG_PUB)] for _ in range(N_BIG_PUB)]
    bodies = {k: os.urandom(BIG) for ks in big_keys for k in ks}
    assert BIG > CLAIM_THRESHOLD
    big_handled, big_errors = [], []
    consumers += [threading.Thread(target=consumer, args=(lb.port, big_handled, lock, stop,
                                                          BIG_QUEUE, bodies))
                  for _ in range(N_BIG_CONS)]
    for t in consumers:
        t.start()
    pubs = [threading.Thread(target=publisher, args=(lb.port, ks, errors)) for ks in keys]
    # The same values again through the fleet (publish dedup answers them)...
    pubs += [threading.Thread(target=publisher, args=(lb.port, ks, errors)) for ks in keys]
    pubs += [threading.Thread(target=publisher,
                              args=(lb.port, ks, big_errors, BIG_QUEUE, bodies, BIG_PAUSE))
             for ks in big_keys]
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
            big_seen = {k for k, _, _ in big_handled}
        if seen >= every and big_seen >= set(bodies) and depth() == 0 \
                and depth(BIG_QUEUE) == 0:
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
    # Every large body came back with its own bytes, whichever proxy
    # stored it and whichever rehydrated it (A's before the kill too).
    wrong = [(k, n) for k, same, n in big_handled if not same]
    assert wrong == [], wrong[:5]
    assert {k for k, _, _ in big_handled} == set(bodies)
    assert depth(BIG_QUEUE) == 0
    # Each object in the bucket is exactly one payload, and every payload
    # is there (a publish retried after the kill may have stored another).
    objects = bucket_objects(s3)
    payloads = set(bodies.values())
    assert all(o in payloads for o in objects.values()), \
        sorted(len(o) for o in objects.values() if o not in payloads)[:5]
    assert set(objects.values()) == payloads
    print("fleet: %d messages, %d handled twice (in flight at the kill), %d publisher "
          "retries; %d claim-checked bodies of %d KiB, %d deliveries, %d objects, %d "
          "publisher retries" % (len(every), len(dups), len(errors), len(bodies), BIG >> 10,
                                 len(big_handled), len(objects), len(big_errors)))


def land_on_each(lb, a, b):
    """Two connections through lb: the first on a, the second on b."""
    on, extra = {}, []
    for _ in range(12):
        before = (a.stats()["connections_open"], b.stats()["connections_open"])
        c = connect(lb.port)
        now, deadline = before, time.time() + 5
        while now == before and time.time() < deadline:
            time.sleep(0.05)
            now = (a.stats()["connections_open"], b.stats()["connections_open"])
        which = a if now[0] > before[0] else b
        if which in on:
            extra.append(c)
        else:
            on[which] = c
        if len(on) == 2:
            break
    for c in extra:
        c.close()
    assert len(on) == 2, "the load balancer sent every connection to one proxy"
    return on[a], on[b]


def test_fleet_claim_published_on_one_proxy_consumed_on_the_other(fleet):
    """A connection on each proxy (through the load balancer, which sends
    the PROXY header they require; which proxy it picks after the kill
    test's restart depends on its health checks, so connections are opened
    until one has landed on each): what one offloads to S3 the other
    rehydrates, both ways, byte for byte."""
    lb, a, b, s3 = fleet["lb"], fleet["a"], fleet["b"], fleet["s3"]
    first, second = land_on_each(lb, a, b)
    before = {m: m.stats() for m in (a, b)}
    got = []
    for pub, con in ((first, second), (second, first)):
        body = os.urandom(BIG)
        pch, cch = pub.channel(), con.channel()
        pch.confirm_delivery()
        pch.basic_publish("", BIG_QUEUE, body)
        m = None
        deadline = time.time() + 30
        while m is None and time.time() < deadline:
            m, _, data = cch.basic_get(BIG_QUEUE, auto_ack=True)
            if m is None:
                time.sleep(0.05)
        assert m is not None
        got.append(data == body)
        assert body in bucket_objects(s3).values()
    first.close()
    second.close()
    assert got == [True, True]
    for m in (a, b):
        after = m.stats()
        assert after["claims_offloaded"] - before[m]["claims_offloaded"] == 1, m.name
        assert after["claims_rehydrated"] - before[m]["claims_rehydrated"] == 1, m.name
