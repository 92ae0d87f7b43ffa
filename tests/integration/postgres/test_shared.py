"""Two proxies with data dirs of their own (two hosts) and one PostgreSQL
database: idempotency keys and publish-dedup windows are one truth for
both. Each of these fails with the LMDB store, where each host remembers
only its own keys."""
import os
import signal
import threading
import time
import uuid

import pika
import pytest

from conftest import DEDUP_Q, IDEM_Q, PASSWORD, Host

BROKER = 5672


def conn(port):
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, socket_timeout=30, blocked_connection_timeout=60))


def publish(port, queue, items, headers_key=None):
    c = conn(port)
    ch = c.channel()
    ch.confirm_delivery()
    for body, props in items:
        ch.basic_publish("", queue, body, props)
    c.close()


def mid(k):
    return pika.BasicProperties(message_id=k)


def dedup(v):
    return pika.BasicProperties(headers={"x-deduplication-header": v})


def get_one(ch, queue, tries=60):
    for _ in range(tries):
        m = ch.basic_get(queue, auto_ack=False)
        if m[0]:
            return m
        time.sleep(0.05)
    return (None, None, None)


def consume_all(port, queue, idle=2.5):
    c = conn(port)
    ch = c.channel()
    ch.basic_qos(prefetch_count=50)
    got = []
    for m, props, body in ch.consume(queue, inactivity_timeout=idle):
        if m is None:
            break
        got.append((props.message_id, body))
        ch.basic_ack(m.delivery_tag)
    ch.cancel()
    c.close()
    return got


def depth(queue):
    c = conn(BROKER)
    n = c.channel().queue_declare(queue, passive=True).method.message_count
    c.close()
    return n


def test_same_key_through_a_then_b_handled_once(pair, fresh):
    a, b = pair
    k = uuid.uuid4().hex
    publish(BROKER, IDEM_Q, [(b"first", mid(k))])
    assert consume_all(a.port, IDEM_Q) == [(k, b"first")]
    publish(BROKER, IDEM_Q, [(b"again", mid(k))])
    # B's consumer never sees it: acknowledged as a duplicate for it.
    assert consume_all(b.port, IDEM_Q) == []
    assert depth(IDEM_Q) == 0
    assert b.metric('acemq_proxy_idempotency_total{answer="duplicate"}') >= 1


def test_consumers_on_both_proxies_handle_each_key_once(pair, fresh):
    a, b = pair
    keys = [uuid.uuid4().hex for _ in range(40)]
    publish(BROKER, IDEM_Q, [(("%s-%d" % (k, r)).encode(), mid(k))
                             for r in range(3) for k in keys])
    results = {}

    def run(h):
        results[h.port] = consume_all(h.port, IDEM_Q, idle=4)

    ts = [threading.Thread(target=run, args=(h,)) for h in (a, b)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    handled = [g[0] for r in results.values() for g in r]
    assert sorted(handled) == sorted(keys), (len(handled), len(keys))
    assert depth(IDEM_Q) == 0


def test_in_progress_across_proxies(pair, fresh):
    """A's consumer holds the claim; B meets the other copy and puts it
    back; once A acks, B's next look says duplicate."""
    a, b = pair
    k = uuid.uuid4().hex
    publish(BROKER, IDEM_Q, [(b"first", mid(k)), (b"second", mid(k))])
    ca = conn(a.port)
    cha = ca.channel()
    first = get_one(cha, IDEM_Q)
    assert first[2] == b"first"
    cb = conn(b.port)
    chb = cb.channel()
    assert get_one(chb, IDEM_Q, tries=20)[0] is None  # held by B, not delivered
    time.sleep(1.5)  # put back after in_progress_delay_s
    assert b.metric('acemq_proxy_idempotency_total{answer="in_progress"}') >= 1
    cha.basic_ack(first[0].delivery_tag)
    ca.close()
    time.sleep(1.5)
    assert get_one(chb, IDEM_Q, tries=40)[0] is None
    cb.close()
    assert depth(IDEM_Q) == 0
    assert b.metric('acemq_proxy_idempotency_total{answer="duplicate"}') >= 1


def test_lease_taken_over_after_sigkill(pair, pg, top, fresh):
    """Proxy C dies by SIGKILL mid-handler without giving up its claim: B
    runs the message once C's lease (3 s) ran out, not before."""
    a, b = pair
    c = Host(top, "c-%s" % uuid.uuid4().hex[:6], pg.url)
    k = uuid.uuid4().hex
    publish(BROKER, IDEM_Q, [(b"k", mid(k))])
    cc = conn(c.port)
    m = get_one(cc.channel(), IDEM_Q)
    assert m[2] == b"k"
    killed = time.time()
    c.proxy.kill9()
    got = []
    cb = conn(b.port)
    chb = cb.channel()
    deadline = time.time() + 20
    while not got and time.time() < deadline:
        m = chb.basic_get(IDEM_Q, auto_ack=False)
        if m[0]:
            got.append(m[2])
            chb.basic_ack(m[0].delivery_tag)
        else:
            time.sleep(0.1)
    cb.close()
    assert got == [b"k"]
    # Not before the lease ran out (the claim was C's, in the database).
    assert time.time() - killed >= 2.5
    assert consume_all(a.port, IDEM_Q) == []
    assert depth(IDEM_Q) == 0


def test_publish_dedup_across_proxies(pair, fresh):
    a, b = pair
    v = uuid.uuid4().hex
    publish(a.port, DEDUP_Q, [(b"one", dedup(v))])
    publish(b.port, DEDUP_Q, [(b"two", dedup(v))])
    assert depth(DEDUP_Q) == 1
    assert b.metric('acemq_proxy_dedup_publish_total{answer="duplicate"}') >= 1


def test_nacked_first_publish_leaves_the_value_free(pair, fresh):
    a, b = pair
    full = "acemq-pg.full-%s" % uuid.uuid4().hex[:8]
    c = conn(BROKER)
    c.channel().queue_declare(full, arguments={"x-max-length": 0,
                                               "x-overflow": "reject-publish"})
    c.close()
    v = uuid.uuid4().hex
    ca = conn(a.port)
    ch = ca.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", full, b"nacked", dedup(v))
    ca.close()
    publish(b.port, DEDUP_Q, [(b"retry", dedup(v))])
    assert depth(DEDUP_Q) == 1
    c = conn(BROKER)
    c.channel().queue_delete(full)
    c.close()


def test_secret_never_shown(pair):
    a, _ = pair
    code, text = a.get("/config")
    assert code == 200
    assert "postgres_url" in text and PASSWORD not in text
    assert PASSWORD not in a.proxy.stderr()


def test_readyz_with_the_database(pair):
    a, _ = pair
    assert a.get("/readyz") == (200, "ready\n")
    assert a.metric("acemq_proxy_postgres_up") == 1
    assert a.metric('acemq_proxy_keys_operations_total{backend="postgresql",op="claim"}') > 0
    assert a.metric("acemq_proxy_postgres_round_trip_seconds_count") > 0


def test_schema_with_version_row(pg, pair):
    assert pg.psql("SELECT version FROM acemq_schema") == [["1"]]
    tables = {r[0] for r in pg.psql("SELECT tablename FROM pg_tables WHERE tablename LIKE "
                                    "'acemq_%'")}
    assert tables == {"acemq_schema", "acemq_idempotency", "acemq_dedup_publish"}


def test_janitor_purges_expired_rows_once(pg, pair):
    """Rows past their time go, removed by the proxies' janitors (every
    second here) under their advisory lock; live rows stay."""
    pg.psql("INSERT INTO acemq_idempotency VALUES ('/', 'old', 'x'::bytea, 2, "
            "now() - interval '1 hour', '\\x00'::bytea)")
    pg.psql("INSERT INTO acemq_dedup_publish SELECT '/', 'old', ('y' || i)::bytea, 2, "
            "now() - interval '1 hour', '\\x00'::bytea FROM generate_series(1, 2500) i")
    pg.psql("INSERT INTO acemq_idempotency VALUES ('/', 'live', 'x'::bytea, 2, "
            "now() + interval '1 hour', '\\x00'::bytea)")
    deadline = time.time() + 20
    left = None
    while time.time() < deadline:
        left = pg.psql("SELECT (SELECT count(*) FROM acemq_idempotency WHERE scope = 'old') + "
                       "(SELECT count(*) FROM acemq_dedup_publish WHERE scope = 'old')")
        if left == [["0"]]:
            break
        time.sleep(0.5)
    assert left == [["0"]]
    assert pg.psql("SELECT count(*) FROM acemq_idempotency WHERE scope = 'live'") == [["1"]]
    a, b = pair
    assert a.metric("acemq_proxy_postgres_purged_total") + \
        b.metric("acemq_proxy_postgres_purged_total") >= 2501
