"""Publish dedup through the real proxy with pika and a real broker: a
publish whose x-deduplication-header value was confirmed within the window
is confirmed to the publisher and not delivered; a value is remembered only
once the broker took the first publish (a nack, a return or a closed channel
leave it free for the retry); the window survives a restart and is shared by
two proxies on one data dir."""
import json
import os
import shutil
import tempfile
import threading
import time
import urllib.request
import uuid

import pika
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
import support  # noqa: E402

VHOST = "acemq-dedup"
VHOST_SHORT = "acemq-dedup-short"  # a window of 2 s
VHOST_CC = "acemq-dedup-cc"        # with the claim check on large bodies too
VHOST_HELD = "acemq-dedup-held"    # its broker reached through a relay a test can hold
EX = "acemq-dd"                    # direct; under the rule
EX_MISSING = "acemq-dd-missing"    # under the rule; declared only by a test
EX_OTHER = "acemq-dd-other"        # direct; not under the rule
HDR = "x-deduplication-header"


def hdr(value, **more):
    headers = {HDR: value}
    headers.update(more)
    return pika.BasicProperties(headers=headers)


@pytest.fixture(scope="module")
def dd():
    """A proxy (with an admin endpoint and a janitor every second) for two
    vhosts with dedup_publish rules, its rules and data dirs."""
    from conftest import Proxy
    support.ensure_rabbitmq(60)
    for v in (VHOST, VHOST_SHORT, VHOST_CC, VHOST_HELD):
        support.rabbitmqctl("add_vhost", v, check=False)
        support.rabbitmqctl("set_permissions", "-p", v, "guest", ".*", ".*", ".*")
    top = tempfile.mkdtemp(prefix="acemq-dedup-")
    rules, data = os.path.join(top, "rules"), os.path.join(top, "data")
    os.makedirs(rules)
    match = '[{"exchange": "%s"}, {"exchange": "%s"}]' % (EX, EX_MISSING)
    with open(os.path.join(rules, "dedup.json"), "w") as f:
        f.write('{"vhost": "%s", "dedup_publish": {"match": %s, "window_s": 600}}'
                % (VHOST, match))
    with open(os.path.join(rules, "short.json"), "w") as f:
        f.write('{"vhost": "%s", "dedup_publish": {"match": %s, "window_s": 2}}'
                % (VHOST_SHORT, match))
    with open(os.path.join(rules, "cc.json"), "w") as f:
        f.write('{"vhost": "%s", "dedup_publish": {"match": %s}, "claim_check": '
                '{"match": [{"exchange": "*"}], "threshold": 1000}}'
                % (VHOST_CC, match[:-1] + ', {"exchange": ""}]'))
    relay = support.HoldingRelay()
    with open(os.path.join(rules, "held.json"), "w") as f:
        f.write('{"vhost": "%s", "upstream": ["127.0.0.1:%d"], "dedup_publish": {"match": %s}}'
                % (VHOST_HELD, relay.port, match))
    admin = support.free_port()
    # state_sync 1 (the pipelined sync), which a test below counts.
    p = Proxy(rules, data, ["--admin", "127.0.0.1:%d" % admin, "--purge-interval-s", "1",
                            "--state-sync", "1"])
    p.admin = admin
    p.top, p.rules_dir, p.data_dir = top, rules, data
    p.relay = relay
    for v in (VHOST, VHOST_SHORT, VHOST_CC, VHOST_HELD):
        c = direct(v)
        ch = c.channel()
        ch.exchange_declare(EX, "direct")
        ch.exchange_declare(EX_OTHER, "direct")
        ch.exchange_delete(EX_MISSING)
        c.close()
    yield p
    rc = p.stop()
    relay.close()
    text = p.stderr()
    shutil.rmtree(top, ignore_errors=True)
    assert rc == 0, text[-3000:]
    assert "AddressSanitizer" not in text and "runtime error" not in text, text[-3000:]


def connect(port, vhost=VHOST):
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, vhost, socket_timeout=30, stack_timeout=60,
        blocked_connection_timeout=120))


def direct(vhost=VHOST):
    return connect(5672, vhost)


def queue(vhost=VHOST, exchange=EX, **args):
    """A fresh queue of the test's own, bound to exchange by its name."""
    name = "acemq-dd-" + uuid.uuid4().hex[:12]
    c = direct(vhost)
    ch = c.channel()
    ch.queue_declare(name, arguments=args or None)
    ch.queue_bind(name, exchange, routing_key=name)
    c.close()
    return name


def drain(q, vhost=VHOST):
    """What the queue holds, straight from the broker: [(props, body)]."""
    c = direct(vhost)
    ch = c.channel()
    out = []
    while True:
        m, props, body = ch.basic_get(q, auto_ack=True)
        if m is None:
            break
        out.append((props, body))
    ch.queue_delete(q)
    c.close()
    return out


def bodies(q, vhost=VHOST):
    return [b for _, b in drain(q, vhost)]


def stats(p):
    with urllib.request.urlopen("http://127.0.0.1:%d/stats" % p.admin, timeout=10) as r:
        return json.loads(r.read().decode())


def vhost_stats(p, vhost=VHOST):
    rows = [r for r in stats(p)["queues"] if r["vhost"] == vhost and "queue" not in r]
    return rows[0] if rows else {"dedup_first": 0, "dedup_duplicate": 0}


def confirmed_channel(p, vhost=VHOST):
    c = connect(p.port, vhost)
    ch = c.channel()
    ch.confirm_delivery()
    return c, ch


def test_rules_view(dd):
    with urllib.request.urlopen("http://127.0.0.1:%d/rules" % dd.admin, timeout=10) as r:
        view = {v["vhost"]: v for v in json.loads(r.read().decode())["vhosts"]}
    assert view[VHOST]["dedup_publish"] == {"header": HDR, "window_s": 600}
    assert view[VHOST_SHORT]["dedup_publish"] == {"header": HDR, "window_s": 2}


def test_repeat_within_window_confirmed_not_delivered(dd):
    q, v = queue(), uuid.uuid4().hex
    before = stats(dd)
    vbefore = vhost_stats(dd)
    c, ch = confirmed_channel(dd)
    for i in range(4):
        ch.basic_publish(EX, q, b"m%d" % i, hdr(v))  # each one confirmed (acked)
    c.close()
    got = drain(q)
    assert [b for _, b in got] == [b"m0"]
    assert got[0][0].headers == {HDR: v}  # the first went on untouched
    after = stats(dd)
    assert after["dedup_duplicate"] - before["dedup_duplicate"] == 3
    assert after["dedup_first"] - before["dedup_first"] == 1
    assert after["publishes_answered"] - before["publishes_answered"] == 3
    vafter = vhost_stats(dd)  # the same, counted for the vhost
    assert vafter["dedup_duplicate"] - vbefore["dedup_duplicate"] == 3
    assert vafter["dedup_first"] - vbefore["dedup_first"] == 1


def test_different_values_and_integer_values(dd):
    q, a, b = queue(), uuid.uuid4().hex, uuid.uuid4().hex
    n = int(time.time() * 1000000)
    c, ch = confirmed_channel(dd)
    ch.basic_publish(EX, q, b"a", hdr(a))
    ch.basic_publish(EX, q, b"b", hdr(b))
    ch.basic_publish(EX, q, b"a again", hdr(a))
    # An integer header is its decimal: the same value as that string.
    ch.basic_publish(EX, q, b"n", hdr(n))
    ch.basic_publish(EX, q, b"n as text", hdr(str(n)))
    ch.basic_publish(EX, q, b"n again", hdr(n))
    c.close()
    assert bodies(q) == [b"a", b"b", b"n"]


def test_without_header_untouched(dd):
    q, v = queue(), uuid.uuid4().hex
    before = stats(dd)
    c, ch = confirmed_channel(dd)
    props = pika.BasicProperties(message_id="same", headers={"x-other": v},
                                 content_type="text/plain")
    ch.basic_publish(EX, q, b"plain", props)
    ch.basic_publish(EX, q, b"plain", props)
    ch.basic_publish(EX, q, b"bare")
    ch.basic_publish(EX, q, b"bare")
    # A header of a kind that is no identity (a table, a boolean) passes too.
    ch.basic_publish(EX, q, b"table", hdr({"id": v}))
    ch.basic_publish(EX, q, b"table", hdr({"id": v}))
    ch.basic_publish(EX, q, b"bool", hdr(True))
    c.close()
    got = drain(q)
    assert [b for _, b in got] == [b"plain", b"plain", b"bare", b"bare", b"table", b"table",
                                   b"bool"]
    assert got[0][0].headers == {"x-other": v}
    assert got[0][0].message_id == "same" and got[0][0].content_type == "text/plain"
    after = stats(dd)
    assert after["dedup_no_header"] - before["dedup_no_header"] == 7
    assert after["dedup_first"] == before["dedup_first"]


def test_non_matching_exchange_untouched(dd):
    q, v = queue(exchange=EX_OTHER), uuid.uuid4().hex
    before = stats(dd)
    c, ch = confirmed_channel(dd)
    for _ in range(3):
        ch.basic_publish(EX_OTHER, q, b"o", hdr(v))
    c.close()
    assert bodies(q) == [b"o", b"o", b"o"]
    after = stats(dd)
    assert after["dedup_first"] == before["dedup_first"]
    assert after["dedup_no_header"] == before["dedup_no_header"]
    # The value is per exchange: under the rule it is a first publish.
    q2 = queue()
    c, ch = confirmed_channel(dd)
    ch.basic_publish(EX, q2, b"e", hdr(v))
    c.close()
    assert bodies(q2) == [b"e"]


def test_window_expires(dd):
    q, v = queue(VHOST_SHORT), uuid.uuid4().hex
    c, ch = confirmed_channel(dd, VHOST_SHORT)
    ch.basic_publish(EX, q, b"1", hdr(v))
    ch.basic_publish(EX, q, b"2", hdr(v))
    time.sleep(2.5)
    ch.basic_publish(EX, q, b"3", hdr(v))  # the window (2 s) is over
    ch.basic_publish(EX, q, b"4", hdr(v))
    c.close()
    assert bodies(q, VHOST_SHORT) == [b"1", b"3"]
    # The janitor (every second here) removes values past their window.
    deadline = time.monotonic() + 15
    while "publish-dedup value" not in dd.stderr() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "vhost %s:" % VHOST_SHORT in dd.stderr()
    assert "past their window removed" in dd.stderr()


def test_without_confirms(dd):
    q, v = queue(), uuid.uuid4().hex
    c = connect(dd.port)
    ch = c.channel()
    for i in range(3):
        ch.basic_publish(EX, q, b"u%d" % i, hdr(v))
    # Remembered once forwarded: a confirmed channel sees a duplicate too.
    ch2 = c.channel()
    ch2.confirm_delivery()
    ch2.basic_publish(EX, q, b"confirmed", hdr(v))
    c.close()
    assert bodies(q) == [b"u0"]


def test_in_flight_publishes_wait_for_the_first(dd):
    """Identical publishes pipelined behind one another, each sent before
    the first was confirmed: one is delivered, every one is acked, in order.
    The broker's confirm of the first is held back in a relay until the
    proxy has made the others wait, so the test does not race the broker."""
    q, v, w = queue(VHOST_HELD), uuid.uuid4().hex, uuid.uuid4().hex
    before = stats(dd)
    c = connect(dd.port, VHOST_HELD)
    ch = c.channel()
    acks = []
    ch._impl.confirm_delivery(
        ack_nack_callback=lambda f: acks.append((type(f.method).__name__,
                                                 f.method.delivery_tag, f.method.multiple)),
        callback=lambda *_: None)
    c.process_data_events(0.2)
    dd.relay.hold()
    try:
        for i in range(5):
            ch._impl.basic_publish(EX, q, b"p%d" % i, hdr(v))
        ch._impl.basic_publish(EX, q, b"w", hdr(w))
        deadline = time.monotonic() + 20
        while (stats(dd)["dedup_waited"] == before["dedup_waited"]
               and time.monotonic() < deadline):
            c.process_data_events(0.05)
        assert stats(dd)["dedup_waited"] > before["dedup_waited"]
        assert acks == [], "confirmed while the broker's answers were held: %r" % acks
    finally:
        dd.relay.release()
    deadline = time.monotonic() + 20
    while len(acks) < 6 and time.monotonic() < deadline:
        c.process_data_events(0.05)
    c.close()
    assert all(a[0] == "Ack" for a in acks), acks
    covered = set()
    for _, tag, multiple in acks:
        covered |= set(range(1, tag + 1)) if multiple else {tag}
    assert covered == set(range(1, 7)), acks
    assert bodies(q, VHOST_HELD) == [b"p0", b"w"]


def test_pipelined_batch_keeps_order(dd):
    """Many publishes sent at once, values repeating among them and some
    without the header: the first of each value and every bare one arrive,
    in publish order; every publish is acked; the checks share commits:
    those of one loop turn go out together, and the checks told a value
    was in flight are asked again with that value's outcome."""
    q = queue()
    values = [uuid.uuid4().hex for _ in range(20)]
    sent, want, seen = [], [], set()
    for i in range(300):
        if i % 7 == 0:
            sent.append((b"bare%d" % i, None))
            want.append(b"bare%d" % i)
            continue
        v = values[(i * 13) % len(values)]
        sent.append((b"%d" % i, hdr(v)))
        if v not in seen:
            seen.add(v)
            want.append(b"%d" % i)
    before = stats(dd)
    c = connect(dd.port)
    ch = c.channel()
    acked = set()

    def on_confirm(f):
        assert type(f.method).__name__ == "Ack"
        top = f.method.delivery_tag
        acked.update(range(1, top + 1) if f.method.multiple else [top])

    ch._impl.confirm_delivery(ack_nack_callback=on_confirm, callback=lambda *_: None)
    c.process_data_events(0.2)
    for body, props in sent:
        ch._impl.basic_publish(EX, q, body, props)
    deadline = time.monotonic() + 30
    while len(acked) < len(sent) and time.monotonic() < deadline:
        c.process_data_events(0.05)
    c.close()
    assert acked == set(range(1, len(sent) + 1))
    assert bodies(q) == want
    after = stats(dd)
    assert after["dedup_first"] - before["dedup_first"] == len(values)
    checked = len([1 for _, props in sent if props])
    assert after["dedup_duplicate"] - before["dedup_duplicate"] == checked - len(values)
    commits = after["state_commits"] - before["state_commits"]
    assert commits < checked // 4, (commits, checked)
    # Every write is made durable by a sync of its own or a later commit's
    # (state_sync=1: syncs overlap the commits that follow them).
    deadline = time.monotonic() + 5
    while after["state_synced_writes"] != after["state_writes"] and time.monotonic() < deadline:
        time.sleep(0.05)
        after = stats(dd)
    assert after["state_synced_writes"] == after["state_writes"]
    syncs = after["state_syncs"] - before["state_syncs"]
    assert 0 < syncs <= after["state_commits"] - before["state_commits"]


def test_two_connections_race(dd):
    q, v = queue(), uuid.uuid4().hex
    errors = []

    def publisher(tag):
        try:
            c, ch = confirmed_channel(dd)
            for i in range(10):
                ch.basic_publish(EX, q, b"%s%d" % (tag, i), hdr(v))
            c.close()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=publisher, args=(t,)) for t in (b"a", b"b", b"c")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(bodies(q)) == 1


def test_nacked_first_publish_does_not_make_retry_a_duplicate(dd):
    # A queue that refuses every publish: the broker nacks it.
    q, v = queue(**{"x-max-length": 0, "x-overflow": "reject-publish"}), uuid.uuid4().hex
    before = stats(dd)
    c, ch = confirmed_channel(dd)
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish(EX, q, b"refused", hdr(v))
    c.close()
    # Fixed: a queue that takes it. The retry is delivered.
    c = direct()
    c.channel().queue_delete(q)
    c.close()
    c = direct()
    dch = c.channel()
    dch.queue_declare(q)
    dch.queue_bind(q, EX, routing_key=q)
    c.close()
    c, ch = confirmed_channel(dd)
    ch.basic_publish(EX, q, b"retry", hdr(v))
    ch.basic_publish(EX, q, b"retry again", hdr(v))  # now it is remembered
    c.close()
    assert bodies(q) == [b"retry"]
    assert stats(dd)["dedup_forgotten"] > before["dedup_forgotten"]


def test_failed_first_publish_does_not_make_retry_a_duplicate(dd):
    # The exchange does not exist: the broker closes the channel (404).
    v = uuid.uuid4().hex
    c, ch = confirmed_channel(dd)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.basic_publish(EX_MISSING, "k", b"lost", hdr(v))
    assert e.value.reply_code == 404
    ch = c.channel()
    ch.confirm_delivery()
    ch.exchange_declare(EX_MISSING, "direct")
    q = queue(exchange=EX_MISSING)
    try:
        ch.basic_publish(EX_MISSING, q, b"retry", hdr(v))
        ch.basic_publish(EX_MISSING, q, b"dup", hdr(v))
        c.close()
        assert bodies(q) == [b"retry"]
    finally:
        c = direct()
        c.channel().exchange_delete(EX_MISSING)
        c.close()


def test_mandatory_unroutable_first_publish_is_returned(dd):
    v = uuid.uuid4().hex
    rk = "acemq-dd-nobody-" + uuid.uuid4().hex[:8]
    c, ch = confirmed_channel(dd)
    with pytest.raises(pika.exceptions.UnroutableError) as e:
        ch.basic_publish(EX, rk, b"unroutable", hdr(v), mandatory=True)
    returned = e.value.messages
    assert len(returned) == 1
    assert returned[0].body == b"unroutable"
    assert returned[0].method.reply_code == 312  # NO_ROUTE, from the broker
    assert returned[0].properties.headers == {HDR: v}
    # It reached no queue: not remembered. Once routable, the retry goes.
    cd = direct()
    dch = cd.channel()
    dch.queue_declare(rk)
    dch.queue_bind(rk, EX, routing_key=rk)
    cd.close()
    ch.basic_publish(EX, rk, b"retry", hdr(v), mandatory=True)
    ch.basic_publish(EX, rk, b"dup", hdr(v), mandatory=True)  # acked, not returned
    c.close()
    assert bodies(rk) == [b"retry"]


def test_restart_keeps_window_and_second_proxy_shares_it(dd):
    from conftest import Proxy
    q, v, k = queue(), uuid.uuid4().hex, uuid.uuid4().hex
    c, ch = confirmed_channel(dd)
    ch.basic_publish(EX, q, b"before", hdr(v))
    c.close()
    dd.stop()
    dd.start()
    c, ch = confirmed_channel(dd)
    ch.basic_publish(EX, q, b"after restart", hdr(v))
    ch.basic_publish(EX, q, b"k", hdr(k))
    c.close()
    # Killed once the value is written: still remembered.
    time.sleep(0.5)
    dd.kill9()
    dd.start()
    c, ch = confirmed_channel(dd)
    ch.basic_publish(EX, q, b"k after kill", hdr(k))
    c.close()
    # A second proxy process on the same data dir sees the same window.
    other = Proxy(dd.rules_dir, dd.data_dir)
    try:
        c, ch = confirmed_channel(other)
        ch.basic_publish(EX, q, b"through the other", hdr(v))
        ch.basic_publish(EX, q, b"new", hdr(q))
        c.close()
        c, ch = confirmed_channel(dd)
        ch.basic_publish(EX, q, b"new again", hdr(q))
        c.close()
    finally:
        assert other.stop() == 0, other.stderr()[-3000:]
        assert "AddressSanitizer" not in other.stderr(), other.stderr()[-3000:]
        assert "runtime error" not in other.stderr(), other.stderr()[-3000:]
    assert bodies(q) == [b"before", b"k", b"new"]


def test_full_store_forwards_and_counts(dd):
    """A state layer that cannot take the values (a map of 1 MiB, full of
    long ones): every publish is still forwarded and acked by the broker
    (fail open), and the failures are counted."""
    from conftest import Proxy
    rules = os.path.join(dd.top, "rules-full")
    os.makedirs(rules)
    ex = "acemq-dd-long-" + "x" * 200
    with open(os.path.join(rules, "dedup.json"), "w") as f:
        f.write('{"vhost": "%s", "dedup_publish": {"match": [{"exchange": "%s"}]}}'
                % (VHOST, ex))
    cd = direct()
    cd.channel().exchange_declare(ex, "direct")
    cd.close()
    q = queue(exchange=ex)
    admin = support.free_port()
    p = Proxy(rules, os.path.join(dd.top, "data-full"),
              ["--state-map-mb", "1", "--admin", "127.0.0.1:%d" % admin])
    p.admin = admin
    n = 3000
    try:
        c = connect(p.port)
        ch = c.channel()
        confirms = {"Ack": set(), "Nack": set()}

        def on_confirm(f):
            top = f.method.delivery_tag
            confirms[type(f.method).__name__].update(
                range(1, top + 1) if f.method.multiple else [top])

        ch._impl.confirm_delivery(ack_nack_callback=on_confirm, callback=lambda *_: None)
        c.process_data_events(0.2)
        for i in range(n):
            value = ("%06d" % i) * 42 + "..."  # 255 bytes: kept as they are
            ch._impl.basic_publish(ex, q, b"%d" % i, hdr(value))
            if i % 100 == 0:
                c.process_data_events(0)
        deadline = time.monotonic() + 60
        while len(confirms["Ack"] | confirms["Nack"]) < n and time.monotonic() < deadline:
            c.process_data_events(0.05)
        c.close()
        assert confirms == {"Ack": set(range(1, n + 1)), "Nack": set()}
        assert len(bodies(q)) == n
        s = stats(p)
        assert s["dedup_store_errors"] > 0
        assert s["dedup_first"] + s["dedup_store_errors"] >= n
        assert "full" in p.stderr()
    finally:
        assert p.stop() == 0, p.stderr()[-3000:]
        assert "AddressSanitizer" not in p.stderr() and "runtime error" not in p.stderr()
        cd = direct()
        cd.channel().exchange_delete(ex)
        cd.close()


def test_with_claim_check(dd):
    """Large bodies the claim check streams to its store as they arrive: a
    duplicate is answered and its upload dropped; the first is offloaded
    and comes back whole through the proxy."""
    q, v = queue(VHOST_CC), uuid.uuid4().hex
    big = os.urandom(300000)
    before = stats(dd)
    c, ch = confirmed_channel(dd, VHOST_CC)
    ch.basic_publish(EX, q, big, hdr(v))
    ch.basic_publish(EX, q, os.urandom(300000), hdr(v))
    ch.basic_publish(EX, q, b"small", hdr(v))
    c.close()
    after = stats(dd)
    assert after["claims_offloaded"] - before["claims_offloaded"] == 1
    assert after["dedup_duplicate"] - before["dedup_duplicate"] == 2
    c = direct(VHOST_CC)
    m, props, body = c.channel().basic_get(q, auto_ack=False)
    assert body[:3] == b"\xac\x01\x01"  # what the broker holds: a claim check
    c.close()
    c = connect(dd.port, VHOST_CC)
    ch = c.channel()
    got = []
    for _ in range(20):
        m, props, body = ch.basic_get(q, auto_ack=True)
        if m is None:
            break
        got.append(body)
    ch.queue_delete(q)
    c.close()
    assert got == [big]


def test_other_exchange_with_claim_check_untouched(dd):
    """A publish another pattern takes (the claim check, on every exchange)
    is not deduplicated when dedup_publish's match does not name it."""
    q, v = queue(VHOST_CC, exchange=EX_OTHER), uuid.uuid4().hex
    before = stats(dd)
    c, ch = confirmed_channel(dd, VHOST_CC)
    ch.basic_publish(EX_OTHER, q, b"a" * 5000, hdr(v))
    ch.basic_publish(EX_OTHER, q, b"b" * 5000, hdr(v))
    ch.basic_publish(EX_OTHER, q, b"small", hdr(v))
    ch.basic_publish(EX_OTHER, q, b"small", hdr(v))
    c.close()
    after = stats(dd)
    assert after["claims_offloaded"] - before["claims_offloaded"] == 2
    assert after["dedup_first"] == before["dedup_first"]
    c = connect(dd.port, VHOST_CC)
    ch = c.channel()
    got = []
    for _ in range(20):
        m, props, body = ch.basic_get(q, auto_ack=True)
        if m is None:
            break
        got.append(body)
    ch.queue_delete(q)
    c.close()
    assert got == [b"a" * 5000, b"b" * 5000, b"small", b"small"]


def test_direct_reply_to_never_deduplicated(dd):
    """Requests answered by direct reply-to and the replies themselves pass
    untouched, even on an exchange under the rule (the default one here)."""
    v = uuid.uuid4().hex
    server = "acemq-dd-rpc-" + uuid.uuid4().hex[:8]
    c = connect(dd.port, VHOST_CC)
    ch = c.channel()
    ch.queue_declare(server)
    replies = []
    ch.basic_consume("amq.rabbitmq.reply-to",
                     lambda _ch, m, props, body: replies.append(body), auto_ack=True)
    ask = pika.BasicProperties(reply_to="amq.rabbitmq.reply-to", headers={HDR: v})
    ch.basic_publish("", server, b"q1", ask)
    ch.basic_publish("", server, b"q2", ask)
    # The responder, through the proxy too, answers both with the same value.
    r = connect(dd.port, VHOST_CC)
    rch = r.channel()
    rch.confirm_delivery()
    got = []
    for _ in range(50):
        m, props, body = rch.basic_get(server, auto_ack=True)
        if m is None:
            if len(got) == 2:
                break
            time.sleep(0.05)
            continue
        got.append(body)
        rch.basic_publish("", props.reply_to, b"re " + body, hdr(v))
    r.close()
    deadline = time.monotonic() + 10
    while len(replies) < 2 and time.monotonic() < deadline:
        c.process_data_events(0.05)
    ch.queue_delete(server)
    c.close()
    assert got == [b"q1", b"q2"]
    assert replies == [b"re q1", b"re q2"]

