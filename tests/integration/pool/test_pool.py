"""Connection pooling through the real proxy and a real broker: short-lived
clients (pika, amqplib, php-amqplib) opening, publishing with a confirm and
closing hundreds of times ride on at most max_connections broker
connections with every message arriving once; credentials are checked
before open-ok; one client's error or exit does not touch another's."""
import json
import os
import shutil
import struct
import subprocess
import threading
import time
import uuid

import pika
import pytest

import amqp_wire as w
import support
from conftest import (USER, VHOST, VHOST_FULL, VHOST_ONE, VHOST_TTL, admin_get,
                      broker_connections, metric)
from rulesproxy import PROXY, Proxy

HERE = os.path.dirname(os.path.abspath(__file__))
NODE_MODULES = os.path.normpath(os.path.join(HERE, "..", "node", "node_modules"))
# 500 cycles per client library; under the sanitizers (a run for memory
# errors, several times slower) 100.
CYCLES = 100 if os.environ.get("ACEMQ_IT_SANITIZED") == "1" else 500


def connect(port, vhost=VHOST, user="guest", password="guest"):
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, vhost, pika.PlainCredentials(user, password),
        connection_attempts=1, socket_timeout=10, stack_timeout=20))


def fresh_queue(vhost=VHOST, **args):
    name = "acemq-pool-" + uuid.uuid4().hex[:10]
    c = connect(5672, vhost)
    c.channel().queue_declare(name, arguments=args or None)
    c.close()
    return name


def drain(queue, vhost=VHOST):
    c = connect(5672, vhost)
    ch = c.channel()
    bodies = []
    while True:
        m, _, body = ch.basic_get(queue, auto_ack=True)
        if m is None:
            break
        bodies.append(body)
    ch.queue_delete(queue)
    c.close()
    return bodies


class Sampler:
    """The most broker connections seen on a vhost while it runs."""

    def __init__(self, vhost):
        self.vhost, self.most, self.samples = vhost, 0, 0
        self.done = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.done.is_set():
            n = broker_connections(self.vhost)
            self.most = max(self.most, n)
            self.samples += 1
            self.done.wait(0.2)

    def stop(self):
        self.done.set()
        self.t.join(30)
        self.most = max(self.most, broker_connections(self.vhost))
        return self.most


def opened(pooled, vhost=VHOST):
    """Pooled broker connections the proxy has opened on vhost so far."""
    return pooled.stderr().count("vhost=%s user=guest broker connection open" % vhost)


def churn_check(pooled, queue, prefix, acked, sampler, opened_before):
    most = sampler.stop()
    bodies = drain(queue)
    assert acked == CYCLES
    assert len(bodies) == CYCLES and len(set(bodies)) == CYCLES
    assert all(b.startswith(prefix) for b in bodies)
    assert most <= 2, most
    # Hundreds of clients, and at most the bound opened (none closes
    # within idle_s): the broker saw no churn.
    assert opened(pooled) - opened_before <= 2
    # The gauge counts the pooled connections of every vhost; this one's
    # stay open until idle_s, so they are in it.
    assert metric(pooled, "acemq_proxy_pool_connections") >= 1


def test_churn_pika(pooled):
    q = fresh_queue()
    before = opened(pooled)
    sampler = Sampler(VHOST)
    acked = 0
    for i in range(CYCLES):
        c = connect(pooled.port)
        ch = c.channel()
        ch.confirm_delivery()
        ch.basic_publish("", q, b"pika-%d-" % i + b"x" * 240)
        acked += 1  # basic_publish raises unless confirmed
        c.close()
    churn_check(pooled, q, b"pika-", acked, sampler, before)
    assert metric(pooled, 'acemq_proxy_pool_auth_total{result="cached"}') >= CYCLES - 2


def test_churn_amqplib(pooled):
    node = shutil.which("node")
    if node is None or not os.path.isdir(os.path.join(NODE_MODULES, "amqplib")):
        pytest.fail("node and amqplib are needed: docker/setup-debian installs them",
                    pytrace=False)
    q = fresh_queue()
    before = opened(pooled)
    sampler = Sampler(VHOST)
    out = subprocess.run([node, os.path.join(HERE, "churn.js"), str(pooled.port), VHOST, q,
                          str(CYCLES)], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, NODE_PATH=NODE_MODULES))
    assert out.returncode == 0, out.stderr[-2000:]
    churn_check(pooled, q, b"node-", int(out.stdout.split()[-1]), sampler, before)


def test_churn_php_amqplib(pooled):
    php = shutil.which("php")
    if php is None or not os.path.exists("/usr/share/php/PhpAmqpLib/autoload.php"):
        pytest.fail("php-cli and php-amqplib are needed: docker/setup-debian installs them",
                    pytrace=False)
    q = fresh_queue()
    before = opened(pooled)
    sampler = Sampler(VHOST)
    out = subprocess.run([php, os.path.join(HERE, "churn.php"), str(pooled.port), VHOST, q,
                          str(CYCLES)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (out.stdout + out.stderr)[-2000:]
    churn_check(pooled, q, b"php-", int(out.stdout.split()[-1]), sampler, before)


def raw_open(port, vhost, password="guest", user="guest"):
    """A raw client's handshake up to connection.open: the frames it got back."""
    c = w.RawClient(port)
    c.send(w.PROTOCOL_HEADER)
    c.expect(w.CONNECTION_START, 0)
    response = b"\x00" + user.encode() + b"\x00" + password.encode()
    c.send(w.method_frame(0, w.CONNECTION_START_OK, w.table({"product": "raw"}) +
                          w.shortstr("PLAIN") + w.longstr(response) + w.shortstr("en_US")))
    c.expect(w.CONNECTION_TUNE, 0)
    c.send(w.method_frame(0, w.CONNECTION_TUNE_OK, struct.pack(">HIH", 2047, 131072, 0)))
    c.send(w.method_frame(0, w.CONNECTION_OPEN, w.shortstr(vhost) + w.shortstr("") + b"\x00"))
    return c, c.read_frame(timeout=15)


def test_wrong_password_refused_at_open(pooled):
    # The pool has trusted guest's password: a wrong one is still checked.
    connect(pooled.port).close()
    c, f = raw_open(pooled.port, VHOST, password="not-the-password")
    assert f.method == w.CONNECTION_CLOSE, f
    close = w.parse_connection_close(f.args)
    assert close["reply_code"] == 403, close
    c.close_socket()
    with pytest.raises((pika.exceptions.ProbableAccessDeniedError,
                        pika.exceptions.ConnectionClosedByBroker)):
        connect(pooled.port, password="wrong")


def test_changed_password(pooled):
    support.rabbitmqctl("delete_user", USER, check=False)
    support.rabbitmqctl("add_user", USER, "first-pass")
    try:
        for v in (VHOST, VHOST_TTL):
            support.rabbitmqctl("set_permissions", "-p", v, USER, ".*", ".*", ".*")
            connect(pooled.port, v, USER, "first-pass").close()
        support.rabbitmqctl("change_password", USER, "second-pass")
        # Within auth_ttl_s the password the broker accepted last is
        # trusted (as an open connection stays open after a change).
        connect(pooled.port, VHOST, USER, "first-pass").close()
        # Past it, the broker is asked again: the old one is refused.
        time.sleep(1.5)
        with pytest.raises((pika.exceptions.ProbableAccessDeniedError,
                            pika.exceptions.ConnectionClosedByBroker)):
            connect(pooled.port, VHOST_TTL, USER, "first-pass")
        # The new one works at once, on either vhost.
        for v in (VHOST, VHOST_TTL):
            c = connect(pooled.port, v, USER, "second-pass")
            c.channel().queue_declare("", exclusive=True)
            c.close()
        # And once the new one is trusted, the old one is checked again.
        with pytest.raises((pika.exceptions.ProbableAccessDeniedError,
                            pika.exceptions.ConnectionClosedByBroker)):
            connect(pooled.port, VHOST, USER, "first-pass")
    finally:
        support.rabbitmqctl("delete_user", USER, check=False)


def two_on_one_connection(pooled):
    """A pika client that published "before" with a confirm, and a raw
    client open on the same (one) broker connection."""
    q = fresh_queue(VHOST_ONE)
    b = connect(pooled.port, VHOST_ONE)
    bch = b.channel()
    bch.confirm_delivery()
    bch.basic_publish("", q, b"before")
    a, f = raw_open(pooled.port, VHOST_ONE)
    assert f.method == w.CONNECTION_OPEN_OK
    return q, b, bch, a


def the_other_goes_on(q, b, bch):
    bch.basic_publish("", q, b"after")
    assert b.is_open
    b.close()
    assert drain(q, VHOST_ONE) == [b"before", b"after"]
    assert broker_connections(VHOST_ONE) <= 1


def test_one_client_error_leaves_the_other(pooled):
    q, b, bch, a = two_on_one_connection(pooled)
    # A publish on a channel never opened: the broker would close the
    # whole (shared) connection; the proxy closes this client only.
    a.send(w.publish_frames(5, q, b"stray", 131072))
    f = a.read_frame()
    assert f.method == w.CONNECTION_CLOSE, f
    assert w.parse_connection_close(f.args)["reply_code"] == 504
    a.close_socket()
    # A broken frame from a third client: its own 501.
    c, f = raw_open(pooled.port, VHOST_ONE)
    c.send(w.frame(1, 0, b"\x00\x0a", end=0x00))
    frames, _ = c.read_until_eof()
    closes = [x for x in frames if x.method == w.CONNECTION_CLOSE]
    assert closes and w.parse_connection_close(closes[0].args)["reply_code"] == 501
    the_other_goes_on(q, b, bch)


def half_a_publish(client, channel, queue, size):
    """A publish's method and header, and its body but for 8 bytes (fewer
    than a connection.close would bring, were it taken for the body)."""
    frames = w.publish_frames(channel, queue, b"x" * size, 131072)
    body_at = frames.index(bytes([w.FRAME_HEADER]) + struct.pack(">H", channel))
    header_len = 7 + struct.unpack_from(">I", frames, body_at + 3)[0] + 1
    client.send(frames[:body_at + header_len] +
                w.frame(w.FRAME_BODY, channel, b"x" * (size - 8)))


@pytest.mark.parametrize("how", ["vanishes", "closed-by-operator"])
def test_client_gone_half_way_through_a_publish_leaves_the_other(pooled, how):
    """A client that vanishes in the middle of a publish, or that the
    operator closes then: nothing of that publish reaches the shared
    broker connection, whose other client goes on undisturbed."""
    q, b, bch, a = two_on_one_connection(pooled)
    a.channel_open(1)
    half_a_publish(a, 1, q, 4000)
    if how == "vanishes":
        a.close_socket()
    else:
        me = "127.0.0.1:%d" % a.sock.getsockname()[1]
        rows = [r for r in json.loads(admin_get(pooled, "/connections"))["rows"]
                if r["address"] == me]
        assert len(rows) == 1, rows
        status, _ = support.admin_request(pooled.admin, "POST",
                                          "/connections/%s/close" % rows[0]["id"])
        assert status == 200
        frames, _ = a.read_until_eof()
        assert any(x.method == w.CONNECTION_CLOSE for x in frames)
    time.sleep(0.5)
    the_other_goes_on(q, b, bch)


def test_flow_off_closes_only_its_client(pooled):
    """channel.flow(active=false) is answered by RabbitMQ with 540 on the
    whole connection: through the pool, only the client that sent it."""
    b = connect(pooled.port, VHOST_ONE)
    bch = b.channel()
    a = connect(pooled.port, VHOST_ONE)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as e:
        a.channel().flow(False)
    assert e.value.reply_code == 540
    bch.queue_declare("", exclusive=True)
    assert b.is_open
    b.close()


def test_update_secret_refused(pooled):
    a, f = raw_open(pooled.port, VHOST_ONE)
    assert f.method == w.CONNECTION_OPEN_OK
    a.send(w.method_frame(0, (10, 70), w.longstr(b"token") + w.shortstr("refresh")))
    f = a.read_frame()
    assert f.method == w.CONNECTION_CLOSE
    close = w.parse_connection_close(f.args)
    assert close["reply_code"] == 530 and "update-secret" in close["reply_text"], close
    a.close_socket()


def basic_consume(client, channel, queue, no_ack=False):
    client.send(w.method_frame(channel, (60, 20), struct.pack(">H", 0) + w.shortstr(queue) +
                               w.shortstr("") + struct.pack(">B", 2 if no_ack else 0) +
                               w.table({})))


def test_leaving_client_leaves_nothing(pooled):
    q = fresh_queue(VHOST_ONE)
    d = connect(5672, VHOST_ONE)
    dch = d.channel()
    for i in range(5):
        dch.basic_publish("", q, b"m%d" % i)
    d.close()
    x = "acemq-pool-x-" + uuid.uuid4().hex[:8]
    a, f = raw_open(pooled.port, VHOST_ONE)
    assert f.method == w.CONNECTION_OPEN_OK
    a.channel_open(1)
    a.send(w.method_frame(1, w.QUEUE_DECLARE, struct.pack(">H", 0) + w.shortstr(x) +
                          struct.pack(">B", 0x04) + w.table({})))  # exclusive
    a.expect(w.QUEUE_DECLARE_OK, 1)
    basic_consume(a, 1, q)
    got = 0
    while got < 5:
        fr = a.read_frame()
        got += fr.type == w.FRAME_METHOD and fr.method == (60, 60)
    # Another client on the same broker connection: the queue is locked.
    b = connect(pooled.port, VHOST_ONE)
    bch = b.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        bch.basic_consume(x, lambda *_: None)
        b.process_data_events(1)
    assert e.value.reply_code == 405
    assert b.is_open
    assert broker_connections(VHOST_ONE) == 1
    # The owner vanishes with five deliveries unacknowledged.
    a.close_socket()
    bch = b.channel()
    redelivered = []
    deadline = time.monotonic() + 20
    while len(redelivered) < 5 and time.monotonic() < deadline:
        m, _, body = bch.basic_get(q, auto_ack=True)
        if m is None:
            b.process_data_events(0.2)
            continue
        assert m.redelivered
        redelivered.append(body)
    assert sorted(redelivered) == [b"m%d" % i for i in range(5)]
    # Its exclusive queue is gone.
    assert support.wait_until(lambda: not queue_exists(x, VHOST_ONE), 10, interval=0.2)
    b.close()


def queue_exists(name, vhost):
    c = connect(5672, vhost)
    try:
        c.channel().queue_declare(name, passive=True)
        return True
    except pika.exceptions.ChannelClosedByBroker:
        return False
    finally:
        support.safe_close(c)


def test_connections_show_the_pooled_connection(pooled):
    c = connect(pooled.port, VHOST_ONE)
    rows = json.loads(admin_get(pooled, "/connections"))["rows"]
    mine = [r for r in rows if r["vhost"] == VHOST_ONE and r["state"] == "open"]
    assert mine and all(r["pool_connection"] > 0 and r["broker"] for r in mine), mine
    assert metric(pooled, "acemq_proxy_pool_channels") >= 0
    c.close()


def test_blocked_fans_out(pooled):
    """A memory alarm: each client on the broker connection that takes
    connection.blocked hears it, and connection.unblocked after."""
    q = fresh_queue(VHOST_ONE)
    sides = []
    for _ in range(2):
        conn = connect(pooled.port, VHOST_ONE)
        ev = []
        conn.add_on_connection_blocked_callback(lambda c, fr, ev=ev: ev.append("blocked"))
        conn.add_on_connection_unblocked_callback(lambda c, fr, ev=ev: ev.append("unblocked"))
        sides.append((conn, conn.channel(), ev))

    def pump(_t=None):
        for conn, _, _ in sides:
            conn.process_data_events(0.05)

    def publish(_t):
        # A broker blocks a connection on its first publish after the alarm.
        if not sides[0][2]:
            sides[0][1].basic_publish("", q, b"during")
        pump()

    try:
        support.rabbitmqctl("set_vm_memory_high_watermark", "0.00000001")
        assert support.wait_until(lambda: all(s[2] for s in sides), 20, interval=0.2,
                                  pump=publish), [s[2] for s in sides]
    finally:
        support.rabbitmqctl("set_vm_memory_high_watermark", "0.4")
    assert support.wait_until(lambda: all(len(s[2]) >= 2 for s in sides), 20, interval=0.1,
                              pump=pump), [s[2] for s in sides]
    for conn, _, ev in sides:
        assert ev[:2] == ["blocked", "unblocked"]
        conn.close()
    drain(q, VHOST_ONE)


def test_full_pool_waits_then_refuses(pooled):
    """max_connections 1 and two channels per connection: a client finding
    the connection full waits, and gets in when a channel closes; one that
    waits past the handshake timeout is refused with 530."""
    a = connect(pooled.port, VHOST_FULL)
    a1, a2 = a.channel(), a.channel()
    waited = {}

    def late():
        t0 = time.monotonic()
        try:
            c = connect(pooled.port, VHOST_FULL)
            waited["ok"] = time.monotonic() - t0
            c.channel().queue_declare("", exclusive=True)
            c.close()
        except Exception as e:  # noqa: BLE001
            waited["error"] = e

    t = threading.Thread(target=late)
    t.start()
    time.sleep(1)
    assert not waited
    assert metric(pooled, "acemq_proxy_pool_clients_waiting") == 1
    a2.close()
    t.join(10)
    assert "ok" in waited and waited["ok"] >= 0.9, waited
    # Full again, and nobody leaves: refused with the pool's reason a
    # little before the handshake timeout (8 s here) would close it.
    refused_before = metric(pooled, 'acemq_proxy_pool_refused_total{reason="full"}')
    b = connect(pooled.port, VHOST_FULL)
    try:
        b.channel()
        t0 = time.monotonic()
        with pytest.raises((pika.exceptions.ConnectionClosedByBroker,
                            pika.exceptions.ProbableAccessDeniedError)) as e:
            connect(pooled.port, VHOST_FULL)
        assert time.monotonic() - t0 >= 5
        assert "every pooled broker connection" in str(e.value), e.value
        assert metric(pooled, 'acemq_proxy_pool_refused_total{reason="full"}') == \
            refused_before + 1
        assert broker_connections(VHOST_FULL) == 1
    finally:
        a.close()
        b.close()


def test_idle_connection_closes(pooled):
    """idle_s 2: once its clients are gone, the broker connection closes."""
    c = connect(pooled.port, VHOST_FULL)
    c.channel()
    assert broker_connections(VHOST_FULL) == 1
    c.close()
    assert support.wait_until(lambda: broker_connections(VHOST_FULL) == 0, 15, interval=0.5)


def test_a_pool_per_worker_within_the_bound(tmp_path):
    """Two workers: two clients accepted one after the other land on both.
    With room under the bound each worker's pool opens its own broker
    connection (no thread between a client and its pool); at a bound of one,
    the second client rides on the first worker's connection."""
    two, one = "acemq-pool-workers", "acemq-pool-workers-one"
    for v in (two, one):
        support.rabbitmqctl("add_vhost", v, check=False)
        support.rabbitmqctl("set_permissions", "-p", v, "guest", ".*", ".*", ".*")
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "two.json").write_text('{"vhost": "%s", "pool": {"max_connections": 2}}' % two)
    (rules / "one.json").write_text('{"vhost": "%s", "pool": {"max_connections": 1}}' % one)
    admin = support.free_port()
    p = Proxy(str(rules), str(tmp_path / "data"),
              ["--admin", "127.0.0.1:%d" % admin, "--workers", "2"])
    p.admin = admin
    try:
        for vhost, conns in ((two, 2), (one, 1)):
            clients = [connect(p.port, vhost) for _ in range(2)]
            for c in clients:
                c.channel()
            rows = [r for r in json.loads(admin_get(p, "/connections"))["rows"]
                    if r["vhost"] == vhost and r["state"] == "open"]
            assert sorted(r["worker"] for r in rows) == [0, 1], rows
            assert len({r["pool_connection"] for r in rows}) == conns, rows
            assert broker_connections(vhost) == conns
            # Both work, whichever connection they ride on.
            q = fresh_queue(vhost)
            for i, c in enumerate(clients):
                ch = c.channel()
                ch.confirm_delivery()
                ch.basic_publish("", q, b"w%d" % i)
                c.close()
            assert sorted(drain(q, vhost)) == [b"w0", b"w1"]
    finally:
        rc = p.stop()
    assert rc == 0, p.stderr()[-3000:]


def test_pool_refused_with_upstream_proxy_protocol(tmp_path):
    (tmp_path / "p.json").write_text('{"vhost": "x", "pool": {}}')
    r = subprocess.run([PROXY, "--check-config", "--rules", str(tmp_path),
                        "--upstream-proxy-protocol", "1"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode != 0
    assert "pool: cannot be used with upstream_proxy_protocol" in r.stderr
    r = subprocess.run([PROXY, "--check-config", "--rules", str(tmp_path)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


def test_amqplain_credentials(pooled):
    """AMQPLAIN (LOGIN and PASSWORD in a table) is checked as PLAIN is."""
    def amqplain(password):
        fields = (w.shortstr("LOGIN") + b"S" + w.longstr(b"guest") +
                  w.shortstr("PASSWORD") + b"S" + w.longstr(password))
        c = w.RawClient(pooled.port)
        c.send(w.PROTOCOL_HEADER)
        c.expect(w.CONNECTION_START, 0)
        c.send(w.method_frame(0, w.CONNECTION_START_OK, w.table({"product": "raw"}) +
                              w.shortstr("AMQPLAIN") + w.longstr(fields) + w.shortstr("en_US")))
        c.expect(w.CONNECTION_TUNE, 0)
        c.send(w.method_frame(0, w.CONNECTION_TUNE_OK, struct.pack(">HIH", 2047, 131072, 0)))
        c.send(w.method_frame(0, w.CONNECTION_OPEN, w.shortstr(VHOST_TTL) + w.shortstr("") +
                              b"\x00"))
        f = c.read_frame(timeout=15)
        c.close_socket()
        return f
    time.sleep(1.2)  # past VHOST_TTL's auth_ttl_s: the broker is asked
    assert amqplain(b"guest").method == w.CONNECTION_OPEN_OK
    f = amqplain(b"wrong")
    assert f.method == w.CONNECTION_CLOSE
    assert w.parse_connection_close(f.args)["reply_code"] == 403


def test_broker_closing_the_connection_tells_each_client(pooled):
    clients = [connect(pooled.port, VHOST_ONE) for _ in range(2)]
    for c in clients:
        c.channel()
    out = support.rabbitmqctl("list_connections", "pid", "vhost", "--no-table-headers").stdout
    pids = [line.split()[0] for line in out.splitlines()
            if len(line.split()) == 2 and line.split()[1] == VHOST_ONE]
    assert len(pids) == 1, out
    support.rabbitmqctl("close_connection", pids[0], "maintenance by the operator")
    for c in clients:
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as e:
            for _ in range(100):
                c.process_data_events(0.1)
        assert e.value.reply_code == 320
        assert "maintenance by the operator" in e.value.reply_text
    # The next client gets a new broker connection.
    c = connect(pooled.port, VHOST_ONE)
    c.channel().queue_declare("", exclusive=True)
    c.close()


def test_heartbeats_per_leg(pooled):
    """A client tuned to 1 s heartbeats stays open while idle: the proxy
    sends it heartbeats itself (the broker's go to the pooled connection)."""
    c = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", pooled.port, VHOST_ONE, heartbeat=1, connection_attempts=1))
    ch = c.channel()
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        c.process_data_events(0.2)
    assert c.is_open
    ch.queue_declare("", exclusive=True)
    c.close()
