"""The database stopped mid-traffic, or hanging: nothing is lost
(idempotency delivers, publish dedup forwards), the failures are counted,
/readyz says so, and the proxy uses the database again once it is back."""
import os
import signal
import subprocess
import threading
import time
import uuid

import pika

import pgcluster
from conftest import DEDUP_Q, IDEM_Q, Host
from test_shared import BROKER, consume_all, conn, dedup, depth, mid, publish

HERE = os.path.dirname(os.path.abspath(__file__))


def wait_ready(h, want, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if h.get("/readyz")[0] == want:
            return True
        time.sleep(0.2)
    return False


def test_database_stopped_mid_traffic(pair, pg, fresh):
    a, b = pair
    keys = [uuid.uuid4().hex for _ in range(150)]
    seen = []
    done = threading.Event()

    def consumer():
        c = conn(a.port)
        ch = c.channel()
        ch.basic_qos(prefetch_count=20)
        for m, props, body in ch.consume(IDEM_Q, inactivity_timeout=0.5):
            if m is None:
                if done.is_set():
                    break
                continue
            seen.append(props.message_id)
            ch.basic_ack(m.delivery_tag)
        ch.cancel()
        c.close()

    t = threading.Thread(target=consumer)
    t.start()
    errors_before = a.metric("acemq_proxy_idempotency_store_errors_total")
    try:
        for i, k in enumerate(keys):
            publish(BROKER, IDEM_Q, [(b"m", mid(k))])
            if i == 50:
                pg.stop()
                assert wait_ready(a, 503)
            if i == 100:
                pg.start()
            time.sleep(0.02)
    finally:
        pg.start()  # no-op when running
        done.set()
        t.join(60)
    assert sorted(seen) == sorted(keys)  # nothing lost
    assert a.metric("acemq_proxy_idempotency_store_errors_total") > errors_before
    assert a.metric("acemq_proxy_postgres_operation_errors_total") > 0
    assert wait_ready(a, 200) and wait_ready(b, 200)
    # Publish dedup forwarded while the database was down; now it works again.
    v = uuid.uuid4().hex
    publish(b.port, DEDUP_Q, [(b"1", dedup(v))])
    publish(a.port, DEDUP_Q, [(b"2", dedup(v))])
    assert depth(DEDUP_Q) == 1
    # A key handled before the stop is still known after it.
    publish(BROKER, IDEM_Q, [(b"again", mid(keys[0]))])
    assert consume_all(b.port, IDEM_Q) == []
    assert depth(IDEM_Q) == 0
    assert "postgres: answers again" in a.proxy.stderr()
    # Logged once per episode, not once per operation.
    assert a.proxy.stderr().count("until it answers (logged once until then)") <= 3


def test_dedup_forwards_while_database_down(pair, pg, fresh):
    a, _ = pair
    pg.stop()
    try:
        assert wait_ready(a, 503)
        v = uuid.uuid4().hex
        publish(a.port, DEDUP_Q, [(b"1", dedup(v)), (b"2", dedup(v))])
        assert depth(DEDUP_Q) == 2  # fail open: forwarded, maybe twice
        assert a.metric("acemq_proxy_dedup_publish_store_errors_total") > 0
    finally:
        pg.start()
    assert wait_ready(a, 200)


def test_database_that_never_answers(top, fresh):
    """A socket that accepts and never answers: each attempt costs at most
    postgres_timeout_ms, the deliveries go on, /readyz says why."""
    hang = pgcluster.HangingListener()
    h = Host(top, "hang-%s" % uuid.uuid4().hex[:6], hang.url, timeout_ms=300)
    try:
        keys = [uuid.uuid4().hex for _ in range(5)]
        publish(BROKER, IDEM_Q, [(b"h", mid(k)) for k in keys])
        got = consume_all(h.port, IDEM_Q, idle=3)
        assert sorted(g[0] for g in got) == sorted(keys)
        assert hang.accepted >= 1
        code, text = h.get("/readyz")
        assert code == 503 and "PostgreSQL" in text
        assert h.metric('acemq_proxy_postgres_connects_total{result="failed"}') >= 1
    finally:
        h.stop()
        hang.close()


def _cluster_pids(pg):
    with open(os.path.join(pg.data, "postmaster.pid")) as f:
        main = int(f.readline())
    out = subprocess.run(["pgrep", "-P", str(main)], stdout=subprocess.PIPE, text=True)
    return [main] + [int(p) for p in out.stdout.split()]


def _resume(pids):
    for p in pids:
        try:
            os.kill(p, signal.SIGCONT)
        except ProcessLookupError:
            pass


def test_database_hanging_mid_round_trip(pg, top, fresh):
    """Every process of the cluster stopped (SIGSTOP) while the proxy is
    connected: a round trip costs at most the timeout, then the
    deliveries go on without it."""
    h = Host(top, "stall-%s" % uuid.uuid4().hex[:6], pg.url, timeout_ms=500)
    pids = []
    try:
        assert wait_ready(h, 200)
        publish(BROKER, IDEM_Q, [(b"x", mid(uuid.uuid4().hex))])
        assert len(consume_all(h.port, IDEM_Q, idle=1.5)) == 1
        pids = _cluster_pids(pg)
        for p in pids:
            try:
                os.kill(p, signal.SIGSTOP)
            except ProcessLookupError:
                pass  # a backend that just ended
        keys = [uuid.uuid4().hex for _ in range(10)]
        publish(BROKER, IDEM_Q, [(b"s", mid(k)) for k in keys])
        got = consume_all(h.port, IDEM_Q, idle=3)
        assert sorted(g[0] for g in got) == sorted(keys)
        assert h.metric('acemq_proxy_postgres_round_trip_errors_total{why="timeout"}') >= 1
        _resume(pids)
        pids = []
        assert wait_ready(h, 200)
    finally:
        _resume(pids)
        h.stop()


def test_unit_decisions_on_a_real_database(pg):
    """tests/unit/test_pgstore against this cluster (make check skips it
    without a database)."""
    proxy = os.environ.get("ACEMQ_PROXY", "")
    unit = os.path.join(os.path.dirname(os.path.dirname(proxy)), "tests", "unit",
                        "test_pgstore")
    if not os.path.exists(unit):
        import pytest
        pytest.skip("%s is not built (make check builds it)" % unit)
    env = dict(os.environ, ACEMQ_TEST_POSTGRES_URL=pg.url, CK_DEFAULT_TIMEOUT="120")
    r = subprocess.run([unit], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]


def unacked():
    import support
    return support.queue_stats(IDEM_Q)[1]


def test_held_ack_counted_once(pg, top, fresh):
    """An ack the idempotency gate holds (its confirm is in a database that
    hangs) is scanned again at each input behind it, and counted in
    frames_to_broker once, when it goes: the ack and ten heartbeats sent
    while it waited are eleven frames."""
    import struct
    import amqp_wire as w
    h = Host(top, "count-%s" % uuid.uuid4().hex[:6], pg.url, timeout_ms=5000)
    pids = []
    try:
        assert wait_ready(h, 200)
        publish(BROKER, IDEM_Q, [(b"x", mid(uuid.uuid4().hex))])
        c = w.RawClient(h.port)
        c.handshake()
        c.channel_open(1)
        got = c.basic_get(1, IDEM_Q, no_ack=False)
        assert got is not None
        tag = got[0]["delivery_tag"]
        pids = _cluster_pids(pg)
        for p in pids:
            try:
                os.kill(p, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        before = h.metric('acemq_proxy_frames_total{direction="to_broker"}')
        c.send(w.method_frame(1, w.BASIC_ACK, struct.pack(">QB", tag, 0)))
        for _ in range(10):
            time.sleep(0.1)
            c.send(w.frame(w.FRAME_HEARTBEAT, 0, b""))
        time.sleep(0.3)
        # Held: neither the ack nor the heartbeats behind it went.
        assert unacked() == 1
        _resume(pids)
        pids = []
        deadline = time.time() + 20
        while unacked() and time.time() < deadline:
            time.sleep(0.1)
        assert unacked() == 0
        after = h.metric('acemq_proxy_frames_total{direction="to_broker"}')
        assert after - before == 11, (before, after)
        c.close()
    finally:
        _resume(pids)
        h.stop()
