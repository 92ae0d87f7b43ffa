"""Delayed messages listed and cancelled through the admin endpoint, with a
real RabbitMQ and pika: GET /schedule/VHOST in due order, DELETE by id and
by target, what a restart keeps, the token, and bad input. A vhost of its
own, so that no other scheduler takes these messages."""
import os
import random
import shutil
import tempfile
import time
import urllib.parse

import pika
import pytest

import amqp_wire as wire
import support
from conftest import Proxy, check_stopped

from prometheus_client.parser import text_string_to_metric_families

VHOST = "acemq-sched-ops"
EXCHANGE = "ops-x"
TOKEN = "ops-token-1"
RULES = ('{"vhost": "%s", "schedule": {"match": [{"exchange": ""}, {"exchange": "%s"}], '
         '"engine": true}}' % (VHOST, EXCHANGE))
ENC = urllib.parse.quote(VHOST, safe="")


def request(port, method, path, token=TOKEN):
    return support.admin_request(port, method, path, token)


def ops_proxy(prefix):
    """A proxy with the rules of VHOST, its ladder declared; and its
    directory, for the caller to remove."""
    top = tempfile.mkdtemp(prefix=prefix)
    rules = os.path.join(top, "rules")
    os.makedirs(rules)
    with open(os.path.join(rules, "ops.json"), "w") as f:
        f.write(RULES)
    p = Proxy(rules, os.path.join(top, "data"), extra=["--admin-token", TOKEN])
    assert support.wait_until(lambda: engine(p).get("ladder_ready") == 1, 20), p.stderr()
    return p, top


@pytest.fixture(scope="module")
def ops():
    support.ensure_rabbitmq(60)
    support.fresh_vhost(VHOST)
    p, top = ops_proxy("acemq-sched-ops-")
    yield p
    check_stopped(p)
    support.rabbitmqctl("delete_vhost", VHOST, check=False)
    shutil.rmtree(top, ignore_errors=True)


def engine(p):
    status, stats = request(p.admin_port, "GET", "/stats")
    assert status == 200, stats
    return stats["engines"].get(VHOST, {})


def direct():
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", support.BROKER_PORT, VHOST))


def fresh_queue(prefix="ops"):
    name = support.unique_name(prefix)
    c = direct()
    ch = c.channel()
    ch.exchange_declare(EXCHANGE, "direct", durable=True)
    ch.queue_declare(name, durable=True)
    ch.queue_bind(name, EXCHANGE, name)
    c.close()
    return name


def publish(p, msgs):
    """msgs: (exchange, routing_key, body, delay_ms, message_id), confirmed."""
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", p.port, VHOST))
    ch = c.channel()
    ch.confirm_delivery()
    for ex, rk, body, delay, mid in msgs:
        ch.basic_publish(ex, rk, body, pika.BasicProperties(
            message_id=mid, delivery_mode=2, headers={"x-delay": delay}))
    c.close()


def listing(p, limit=1000, after=None):
    q = "?limit=%d" % limit + ("&after=" + after if after else "")
    status, body = request(p.admin_port, "GET", "/schedule/%s%s" % (ENC, q))
    assert status == 200, body
    return body


def pending_for(p, rk):
    return [e for e in listing(p)["pending"] if e["routing_key"] == rk]


def drain(queue, count, timeout):
    got = []
    c = direct()
    ch = c.channel()
    deadline = time.time() + timeout
    while len(got) < count and time.time() < deadline:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            c.process_data_events(0.05)
            continue
        got.append((props, body))
    c.close()
    return got


def test_hundred_listed_in_due_order_ten_cancelled_never_arrive(ops):
    q = fresh_queue()
    before = engine(ops).get("cancelled", 0)
    delays = [random.randint(4000, 8000) for _ in range(100)]
    t0 = time.time()
    publish(ops, [("", q, b"body-%d" % i, d, "m-%d" % i) for i, d in enumerate(delays)])
    mine = pending_for(ops, q)
    assert time.time() - t0 < 4, "published too slowly for the listing to be checked"
    assert len(mine) == 100, mine[:3]
    dues = [e["due_at"] for e in mine]
    assert dues == sorted(dues)
    assert len({e["id"] for e in mine}) == 100
    by_mid = {e["message_id"]: e for e in mine}
    assert set(by_mid) == {"m-%d" % i for i in range(100)}
    for i, d in enumerate(delays):
        e = by_mid["m-%d" % i]
        assert e["exchange"] == "" and e["size"] == len(b"body-%d" % i)
        # due at publish time plus the delay (the proxy's clock is this host's)
        assert t0 * 1000 + d - 50 <= e["due_at"] <= time.time() * 1000 + d + 50
    whole = listing(ops)
    assert whole["vhost"] == VHOST and whole["next"] is None
    assert {"exchange": "", "routing_key": q, "pending": 100} in whole["targets"]
    # Pages of 30 walk the same list.
    paged, after = [], None
    while True:
        page = listing(ops, 30, after)
        paged += page["pending"]
        after = page["next"]
        if after is None:
            break
        assert len(page["pending"]) == 30
    assert [e["id"] for e in paged] == [e["id"] for e in whole["pending"]]

    cancelled = random.sample(mine, 10)
    for e in cancelled:
        status, body = request(ops.admin_port, "DELETE", "/schedule/%s/%s" % (ENC, e["id"]))
        assert status == 200 and body["cancelled"] is True, body
    left = pending_for(ops, q)
    assert len(left) == 90
    assert not {e["id"] for e in cancelled} & {e["id"] for e in left}
    assert listing(ops)["cancelled"] >= 10

    got = drain(q, 90, 20)
    # Everything due has been seen by now; a cancelled one would be here.
    time.sleep(max(0, t0 + 8 + 2.5 - time.time()))
    got += drain(q, 100, 0.5)
    arrived = sorted(props.message_id for props, _ in got)
    assert arrived == sorted(e["message_id"] for e in left)
    for props, _ in got:
        assert "x-schedule-id" not in (props.headers or {})
    assert support.wait_until(lambda: engine(ops)["cancelled"] == before + 10, 10), engine(ops)
    fams = {f.name: f for f in text_string_to_metric_families(
        request(ops.admin_port, "GET", "/metrics")[1].decode())}
    events = {s.labels["event"]: s.value for s in fams["acemq_proxy_schedule"].samples
              if s.labels.get("vhost") == VHOST and s.name.endswith("_total")}
    assert events["cancelled"] == before + 10
    # Delivered and dropped ones' records go.
    assert support.wait_until(lambda: pending_for(ops, q) == [], 10)
    assert support.wait_until(lambda: listing(ops)["cancelled"] == 0, 10)


def state_counts(p):
    status, stats = request(p.admin_port, "GET", "/stats")
    assert status == 200, stats
    return stats["state_commits"], stats["state_writes"]


def burst(q, n, delay_of):
    """n publishes to q in one write; delay_of(i): the x-delay, or None."""
    out = []
    for i in range(n):
        d = delay_of(i)
        props = {"message_id": "b-%d" % i, "headers": {} if d is None else {"x-delay": d}}
        out.append(wire.publish_frames(1, q, b"burst-%d" % i, 131072, props))
    return b"".join(out)


def test_burst_of_delayed_publishes_shares_commits(ops):
    """Publishes sent together are recorded together: while the first waits
    for its record, the delayed ones behind it are looked ahead at and
    their records written in the same commits. Publishes without a delay,
    with a zero delay, between them change nothing: every delayed one is
    listed once, with its own target, and arrives."""
    q = fresh_queue("burst")
    n = 300

    def delay_of(i):
        if i % 7 == 3:
            return None  # no header: not held at all
        if i % 11 == 5:
            return 0  # delivered at once, header dropped
        return 3000 + i

    delayed = {"b-%d" % i for i in range(n) if delay_of(i)}
    commits0, writes0 = state_counts(ops)
    c = wire.RawClient(ops.port).handshake(vhost=VHOST)
    try:
        c.channel_open(1)
        c.confirm_select(1)
        c.send(burst(q, n, delay_of))
        acked, nacked, _ = wire.collect_confirms(c, 1, n, 30)
        assert len(acked) == n and not nacked
    finally:
        c.close_socket()
    mine = pending_for(ops, q)
    assert sorted(e["message_id"] for e in mine) == sorted(delayed)
    assert len({e["id"] for e in mine}) == len(delayed)
    assert all(e["exchange"] == "" and e["routing_key"] == q for e in mine)
    commits, writes = state_counts(ops)
    # One record a publish, several a commit (one a commit without the
    # look-ahead).
    assert writes - writes0 >= len(delayed)
    assert commits - commits0 <= len(delayed) / 3, (commits - commits0, len(delayed))
    got = drain(q, n, 30)
    assert sorted(p.message_id for p, _ in got) == sorted("b-%d" % i for i in range(n))
    for p, body in got:
        assert body == b"burst-" + p.message_id[2:].encode()
        assert "x-schedule-id" not in (p.headers or {}) and "x-delay" not in (p.headers or {})
    assert support.wait_until(lambda: pending_for(ops, q) == [], 10)


def test_client_gone_mid_burst_leaves_no_record_without_its_message(ops):
    """A client that sends a burst of delayed publishes and vanishes: the
    records written ahead for publishes never forwarded go, so every record
    left is one whose message is in the ladder: once those have arrived,
    none is left."""
    q = fresh_queue("gone")
    for attempt in range(3):
        c = wire.RawClient(ops.port).handshake(vhost=VHOST)
        c.channel_open(1)
        c.send(burst(q, 200, lambda i: 2000))
        c.close_socket()
    # What arrives is delivered by the scheduler, which removes its record;
    # a record whose message never reached the ladder would stay listed
    # (for a day, until the janitor).
    # (Under a sanitizer the clients may vanish before any publish went.)
    got = drain(q, 600, 8)
    assert support.wait_until(lambda: pending_for(ops, q) == [], 15), \
        (len(got), len(pending_for(ops, q)))


def test_cancel_by_target(ops):
    q1, q2 = fresh_queue(), fresh_queue()
    publish(ops, [("", q1, b"a", 3000, "a-%d" % i) for i in range(20)] +
            [("", q2, b"b", 3000, "b-%d" % i) for i in range(5)] +
            [(EXCHANGE, q1, b"c", 3000, "c-%d" % i) for i in range(3)] +
            [(EXCHANGE, q2, b"d", 3000, "d-%d" % i) for i in range(4)])
    t0 = time.time()
    status, body = request(ops.admin_port, "DELETE",
                           "/schedule/%s?exchange=&routing_key=%s" % (ENC, q1))
    assert status == 200 and body["cancelled"] == 20, body
    assert body["exchange"] == "" and body["routing_key"] == q1
    # An exchange alone: every routing key of it.
    status, body = request(ops.admin_port, "DELETE", "/schedule/%s?exchange=%s" % (ENC, EXCHANGE))
    assert status == 200 and body["cancelled"] == 7 and body["routing_key"] is None, body
    got2 = drain(q2, 5, 15)
    time.sleep(max(0, t0 + 3 + 2.5 - time.time()))
    got1 = drain(q1, 100, 0.5)
    got2 += drain(q2, 100, 0.5)
    assert sorted(p.message_id for p, _ in got2) == ["b-%d" % i for i in range(5)]
    assert got1 == []


def test_restart_keeps_the_list(ops):
    q = fresh_queue()
    publish(ops, [("", q, b"later", 120000, "r-%d" % i) for i in range(5)])
    before = pending_for(ops, q)
    assert len(before) == 5
    rc = ops.stop()
    assert rc == 0, ops.stderr()[-2000:]
    ops.start()
    assert support.wait_until(lambda: support.port_accepts(ops.admin_port), 10)
    after = pending_for(ops, q)
    assert after == before
    # Cancelled after the restart too (the scheduler drops them at their next hop).
    status, body = request(ops.admin_port, "DELETE",
                           "/schedule/%s?exchange=&routing_key=%s" % (ENC, q))
    assert status == 200 and body["cancelled"] == 5, body
    assert pending_for(ops, q) == []


def test_every_route_asks_for_the_token(ops):
    q = fresh_queue()
    publish(ops, [("", q, b"x", 60000, "t-0")])
    (e,) = pending_for(ops, q)
    paths = [("GET", "/schedule/%s" % ENC),
             ("GET", "/schedule/%s?limit=5" % ENC),
             ("DELETE", "/schedule/%s/%s" % (ENC, e["id"])),
             ("DELETE", "/schedule/%s?exchange=&routing_key=%s" % (ENC, q))]
    for method, path in paths:
        for token in (None, "wrong"):
            status, _ = request(ops.admin_port, method, path, token=token)
            assert status == 401, (method, path, token, status)
    assert pending_for(ops, q) == [e]
    status, body = request(ops.admin_port, "DELETE", "/schedule/%s/%s" % (ENC, e["id"]))
    assert status == 200, body


def test_bad_input_gets_4xx(ops):
    unknown = "0" * 32
    cases = [
        ("DELETE", "/schedule/%s/%s" % (ENC, unknown), 404),
        ("DELETE", "/schedule/%s/xyz" % ENC, 400),
        ("DELETE", "/schedule/%s/%s" % (ENC, "g" * 32), 400),
        ("GET", "/schedule/%s/%s" % (ENC, unknown), 405),
        ("GET", "/schedule/%zz", 400),
        ("GET", "/schedule/%2", 400),
        ("GET", "/schedule/acemq%00x", 400),
        ("GET", "/schedule/%s/%%2" % ENC, 400),
        ("GET", "/schedule/", 400),
        ("GET", "/schedule/no-such-vhost", 404),
        ("GET", "/schedule/%2F", 404),
        ("GET", "/schedule/%s?limit=100000" % ENC, 400),
        ("GET", "/schedule/%s?limit=99999999999999999999999" % ENC, 400),
        ("GET", "/schedule/%s?limit=0" % ENC, 400),
        ("GET", "/schedule/%s?limit=-5" % ENC, 400),
        ("GET", "/schedule/%s?limit=ten" % ENC, 400),
        ("GET", "/schedule/%s?after=nope" % ENC, 400),
        ("GET", "/schedule/%s?after=%%zz" % ENC, 400),
        ("DELETE", "/schedule/%s" % ENC, 400),
        ("DELETE", "/schedule/%s?routing_key=q" % ENC, 400),
        ("DELETE", "/schedule/%s?exchange=%%G1" % ENC, 400),
        ("POST", "/schedule/%s" % ENC, 405),
    ]
    for method, path, code in cases:
        status, body = request(ops.admin_port, method, path)
        assert status == code, (method, path, status, body)
        if isinstance(body, dict):
            assert "error" in body, body
    # Unknown ids after the cursor: a page that is simply empty.
    assert listing(ops, 10, "f" * 32)["pending"] == []
    assert ops.proc.poll() is None
    status, _ = request(ops.admin_port, "GET", "/health")
    assert status == 200


def test_confirm_of_a_delayed_publish_waits_for_its_record(ops, monkeypatch):
    """A rewritten publish is forwarded while its record is written, and its
    client's confirm waits for the record: with each commit of the records
    held back 400 ms (the test build's ACEMQ_PROXY_TEST_COMMIT_DELAY_MS), an
    undelayed publish sent after a delayed one on the same channel is
    confirmed first, alone (a multiple ack would cover the delayed one), and
    the delayed one's confirm comes only once its record is listed. (A
    proxy of its own beside ops's, on the same vhost.)"""
    import rulesproxy
    monkeypatch.setattr(rulesproxy, "PROXY", os.environ.get("ACEMQ_PROXY_TEST", rulesproxy.PROXY))
    monkeypatch.setenv("ACEMQ_PROXY_TEST_COMMIT_DELAY_MS", "400")
    p, top = ops_proxy("acemq-sched-hold-")
    try:
        assert "waits 400 ms" in p.stderr()
        q = fresh_queue("hold")
        c = wire.RawClient(p.port).handshake(vhost=VHOST)
        c.channel_open(1)
        c.confirm_select(1)
        t0 = time.monotonic()
        c.publish(1, q, b"later", {"message_id": "held-1", "headers": {"x-delay": 600000}},
                  exchange=EXCHANGE)
        c.publish(1, q, b"now", {"message_id": "plain-2"}, exchange=EXCHANGE)
        acked, nacked, frames = wire.collect_confirms(c, 1, 2, timeout=20)
        assert acked == {1, 2} and not nacked
        assert [(t, m) for _, t, m in frames] == [(2, False), (1, False)], frames
        # The undelayed one reached its queue at once; the delayed one's
        # record was there before its confirm.
        assert time.monotonic() - t0 >= 0.35
        assert [e["message_id"] for e in pending_for(p, q)] == ["held-1"]
        assert len(drain(q, 1, 5)) == 1
        c.close_socket()
    finally:
        check_stopped(p)
        shutil.rmtree(top, ignore_errors=True)


def rung_rejects(rung_queue):
    """Whether a confirmed publish straight into rung_queue is nacked."""
    c = direct()
    ch = c.channel()
    ch.confirm_delivery()
    try:
        ch.basic_publish("acemq.schedule", rung_queue, b"probe")
        return False
    except pika.exceptions.NackError:
        return True
    finally:
        c.close()


def test_a_delayed_publish_the_broker_nacks_is_not_listed(ops):
    """The broker nacks a delayed publish (its rung, the 10 m one, is made
    full by a policy: max-length 0, reject-publish): the client gets the
    nack, and its record goes, so nothing is listed that will never fire.
    A publish of another rung on the same channel stays listed."""
    q = fresh_queue("nack")
    policy = support.unique_name("reject-rung")
    support.rabbitmqctl("set_policy", "-p", VHOST, "--apply-to", "queues", policy,
                        r"^acemq\.schedule\.10m$", '{"max-length": 0, "overflow": "reject-publish"}')
    try:
        assert support.wait_until(lambda: rung_rejects("acemq.schedule.10m"), 15)
        c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", ops.port, VHOST))
        ch = c.channel()
        ch.confirm_delivery()
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish(EXCHANGE, q, b"never", pika.BasicProperties(
                message_id="nacked-1", headers={"x-delay": 15 * 60 * 1000}))
        ch.basic_publish(EXCHANGE, q, b"later", pika.BasicProperties(
            message_id="kept-2", headers={"x-delay": 2 * 3600 * 1000}))
        c.close()
        assert support.wait_until(
            lambda: [e["message_id"] for e in pending_for(ops, q)] == ["kept-2"], 10), \
            pending_for(ops, q)
    finally:
        support.rabbitmqctl("clear_policy", "-p", VHOST, policy, check=False)
    status, body = request(ops.admin_port, "DELETE",
                           "/schedule/%s?exchange=%s&routing_key=%s" % (ENC, EXCHANGE, q))
    assert status == 200, body
