"""A vhost's own brokers: a rules file's "upstream" list sends that vhost's
clients to other brokers than the global list. The broker is chosen only
when connection.open names the vhost, so the proxy greets every client
itself and replays the client's start-ok, tuning and open to the broker it
chose. Tested against a second RabbitMQ node of the test's own, where a
vhost exists that the main broker does not have."""
import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
import urllib.request

import pika
import pytest

import amqp_wire as w
import support
from conftest import PROXY_BIN, ProxyProcess

NODE = "acemq-vb@localhost"
PORT = int(os.environ.get("ACEMQ_VB_BROKER_PORT", "5685"))
DIST = int(os.environ.get("ACEMQ_VB_DIST_PORT", "25685"))
VHOST = "acemq-routed"


def ctl_b(*args, check=True):
    return support.rabbitmqctl("-n", NODE, *args, check=check)


@pytest.fixture(scope="module")
def node_b():
    """A second broker with a vhost of its own."""
    top = support.start_node(NODE, "listeners.tcp.default = %d\n" % PORT, PORT, DIST)
    ctl_b("add_vhost", VHOST)
    ctl_b("set_permissions", "-p", VHOST, "guest", ".*", ".*", ".*")
    yield PORT
    support.stop_node(NODE, top)


class Routed(object):
    """A proxy whose global list is the main broker, with rules files that
    give some vhosts brokers of their own."""

    def __init__(self, vhosts, extra=(), upstreams=None):
        self.dir = tempfile.mkdtemp(prefix="acemq-vb-")
        for i, (vhost, upstream) in enumerate(sorted(vhosts.items())):
            with open(os.path.join(self.dir, "v%d.json" % i), "w") as f:
                json.dump({"vhost": vhost, "upstream": upstream}, f)
        self.admin = support.free_port()
        self.proxy = ProxyProcess("acemq-proxy-vb", PROXY_BIN, support.BROKER_PORT,
                                  upstreams=upstreams,
                                  extra_args=["--rules", self.dir, "--admin",
                                              "127.0.0.1:%d" % self.admin] + list(extra))
        self.proxy.start()
        self.port = self.proxy.listen_port

    def stop(self):
        self.proxy.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def routed(node_b):
    r = Routed({VHOST: ["127.0.0.1:%d" % node_b]})
    yield r
    r.stop()


def queues(vhost, node=None):
    args = (["-n", node] if node else []) + ["list_queues", "-p", vhost, "name", "--no-table-headers"]
    return set(support.rabbitmqctl(*args).stdout.split())


def round_trip(port, vhost, queue, **kw):
    conn = support.connect(port, virtual_host=vhost, **kw)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue, auto_delete=False)
        ch.basic_publish("", queue, b"routed by vhost")
        got = ch.basic_get(queue, auto_ack=True)[2]
        assert got == b"routed by vhost"
        return conn._impl.server_properties
    finally:
        support.safe_close(conn)


def test_each_vhost_reaches_its_broker(routed):
    """The routed vhost reaches node B (the main broker has no such vhost);
    "/" reaches the global list's broker."""
    qb, qa = support.unique_name("vb"), support.unique_name("va")
    try:
        first = round_trip(routed.port, VHOST, qb)
        props = round_trip(routed.port, "/", qa)
        assert qb in queues(VHOST, NODE)
        assert qa in queues("/")
        assert qa not in queues("/", NODE)
        # The client was greeted by the proxy, with the properties the
        # global list's broker announced (the vhost is not known yet when
        # connection.start is sent).
        assert first["product"] == "RabbitMQ", first
        assert props["product"] == "RabbitMQ", props
        assert props["capabilities"]["publisher_confirms"] is True
        assert props["version"] == ctl_b("eval", "rabbit_misc:version().").stdout.strip().strip('"')
    finally:
        ctl_b("delete_queue", "-p", VHOST, qb, check=False)
        support.rabbitmqctl("delete_queue", qa, check=False)
    with urllib.request.urlopen("http://127.0.0.1:%d/rules" % routed.admin, timeout=5) as r:
        rules = json.loads(r.read().decode())
    [v] = [v for v in rules["vhosts"] if v["vhost"] == VHOST]
    assert v["upstream"] == ["127.0.0.1:%d" % PORT]


def broker_properties(port):
    """What a broker announces to a client that connects to it directly."""
    conn = support.connect(port)
    try:
        return conn._impl.server_properties
    finally:
        support.safe_close(conn)


def first_greeting(port, vhost):
    """The connection.start a new client of the proxy gets, its handshake
    then completed (the vhost's broker took it)."""
    c = w.RawClient(port)
    try:
        c.handshake(vhost=vhost)
        c.close()
    finally:
        c.close_socket()
    return c.start["server_properties"]


def same_broker(seen, expected):
    """All of it: product, version, cluster name, capabilities."""
    assert seen["product"] == "RabbitMQ", seen
    assert seen == expected


def test_first_client_sees_the_global_brokers_properties(node_b):
    """A fresh proxy asks its brokers what they announce before any client
    does: the very first client sees the global list's broker (product,
    version, its cluster name), whatever its vhost, not the proxy's own."""
    expected = broker_properties(support.BROKER_PORT)
    r = Routed({VHOST: ["127.0.0.1:%d" % node_b]})
    try:
        same_broker(first_greeting(r.port, VHOST), expected)
        same_broker(first_greeting(r.port, "/"), expected)
    finally:
        r.stop()


def test_first_client_sees_a_vhost_lists_broker(node_b):
    """No broker of the global list answers: the greeting shows what a
    vhost list's broker (node B) announced, from the first client on."""
    expected = broker_properties(node_b)
    assert expected["cluster_name"] != broker_properties(support.BROKER_PORT)["cluster_name"]
    r = Routed({VHOST: ["127.0.0.1:%d" % node_b]},
               upstreams=["127.0.0.1:%d" % support.free_port()])
    try:
        same_broker(first_greeting(r.port, VHOST), expected)
    finally:
        r.stop()


def test_reload_asks_a_new_lists_brokers(node_b):
    """A reload that names a new broker: the first client after it sees
    that broker's properties (the global list and the other list do not
    answer)."""
    expected = broker_properties(node_b)
    r = Routed({"acemq-unused": ["127.0.0.1:%d" % support.free_port()]},
               upstreams=["127.0.0.1:%d" % support.free_port()])
    try:
        with open(os.path.join(r.dir, "z.json"), "w") as f:
            json.dump({"vhost": VHOST, "upstream": ["127.0.0.1:%d" % node_b]}, f)
        urllib.request.urlopen(urllib.request.Request(
            "http://127.0.0.1:%d/reload" % r.admin, method="POST"), timeout=10).read()
        same_broker(first_greeting(r.port, VHOST), expected)
    finally:
        r.stop()


def test_failover_within_the_vhost_list(node_b):
    bad = "127.0.0.1:%d" % support.free_port()
    r = Routed({VHOST: [bad, "127.0.0.1:%d" % node_b]})
    q = support.unique_name("vb")
    try:
        round_trip(r.port, VHOST, q)
        round_trip(r.port, VHOST, q)
        log = r.proxy.log_text()
        assert "cannot connect to broker %s" % bad in log
        assert log.count("cannot connect to broker %s" % bad) == 1, log
    finally:
        ctl_b("delete_queue", "-p", VHOST, q, check=False)
        r.stop()


def test_vhost_broker_closes_before_start(node_b):
    lst = support.closing_listener()
    bad = "%s:%d" % lst.getsockname()
    r = Routed({VHOST: [bad, "127.0.0.1:%d" % node_b]})
    q = support.unique_name("vb")
    try:
        round_trip(r.port, VHOST, q)
        assert "broker %s closed before connection.start" % bad in r.proxy.log_text()
    finally:
        ctl_b("delete_queue", "-p", VHOST, q, check=False)
        r.stop()
        lst.close()


def test_no_broker_of_the_vhost_answers(node_b):
    r = Routed({VHOST: ["127.0.0.1:%d" % support.free_port(), "127.0.0.1:%d" % support.free_port()]})
    try:
        with pytest.raises(pika.exceptions.AMQPConnectionError) as e:
            support.connect(r.port, virtual_host=VHOST)
        assert "320" in str(e.value) and "no broker for vhost '%s' answers" % VHOST in str(e.value)
        # Another vhost is not affected.
        support.connect(r.port).close()
        assert r.proxy.alive()
    finally:
        r.stop()


def test_wrong_password_is_the_brokers_refusal(routed):
    """pika asks for authentication_failure_close: the broker's own 403
    reaches it."""
    conn = None
    with pytest.raises(pika.exceptions.AMQPConnectionError) as e:
        conn = pika.BlockingConnection(pika.ConnectionParameters(
            host=support.HOST, port=routed.port, virtual_host=VHOST, connection_attempts=1,
            credentials=pika.PlainCredentials("guest", "not-the-password")))
    support.safe_close(conn)
    assert "403" in str(e.value) and "ACCESS_REFUSED" in str(e.value)


def test_wrong_password_without_failure_close(routed):
    """A client that does not ask for authentication_failure_close: the
    broker just closes; the proxy, which already tuned the client, says 403."""
    c = w.RawClient(routed.port)
    try:
        with pytest.raises(AssertionError) as e:
            c.handshake(vhost=VHOST, password="not-the-password", capabilities={})
        assert "403" in str(e.value) and "ACCESS_REFUSED" in str(e.value)
    finally:
        c.close_socket()


def test_vhost_missing_on_the_chosen_broker(node_b):
    """The vhost's list names the main broker, which has no such vhost: its
    530 reaches the client as the broker said it."""
    r = Routed({VHOST: ["127.0.0.1:%d" % support.BROKER_PORT]})
    try:
        with pytest.raises(pika.exceptions.AMQPConnectionError) as e:
            support.connect(r.port, virtual_host=VHOST)
        assert "530" in str(e.value) and "NOT_ALLOWED" in str(e.value)
    finally:
        r.stop()


def test_client_tuning_reaches_the_broker(routed):
    """frame_max, channel_max and heartbeat the client chose are what the
    broker agreed to; a body in frames of the client's frame_max passes."""
    c = w.RawClient(routed.port)
    q = support.unique_name("vb")
    try:
        c.handshake(vhost=VHOST, frame_max=8192, channel_max=7, heartbeat=30)
        assert c.tune == {"channel_max": 2047, "frame_max": 131072, "heartbeat": 60}
        assert c.start["mechanisms"] == b"PLAIN AMQPLAIN"
        c.channel_open(1)
        c.queue_declare(1, q)
        c.publish(1, q, b"y" * 20000)  # three body frames of at most 8184 bytes
        seen = ""
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and VHOST not in seen:
            seen = ctl_b("list_connections", "vhost", "frame_max", "channel_max", "timeout",
                         "--no-table-headers").stdout
            time.sleep(0.2)
        [row] = [line.split() for line in seen.splitlines() if VHOST in line]
        assert row == [VHOST, "8192", "7", "30"], seen
        conn = support.connect(routed.port, virtual_host=VHOST)
        try:
            got = conn.channel().basic_get(q, auto_ack=True)[2]
        finally:
            conn.close()
        assert got == b"y" * 20000
    finally:
        c.close_socket()
        ctl_b("delete_queue", "-p", VHOST, q, check=False)


def fake_broker(frame_max):
    """A listener that speaks the broker's side up to connection.tune with a
    small frame_max, and records what it is sent. The proxy's probe (a
    connection that goes after connection.start) is answered and let go."""
    lst = socket.socket()
    lst.bind((support.HOST, 0))
    lst.listen(4)
    got = {"probes": 0}

    def serve(s):
        hdr = s.recv(8)
        got["header"] = hdr
        caps = w.table({"product": "fake"})
        s.sendall(w.method_frame(0, w.CONNECTION_START, b"\x00\x09" + caps +
                                 w.longstr("PLAIN") + w.longstr("en_US")))
        data = b""
        while len(data) < 7 or len(data) < 8 + struct.unpack_from(">I", data, 3)[0]:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        if not data:
            got["probes"] += 1
            return False
        got["start_ok"] = data
        s.sendall(w.method_frame(0, w.CONNECTION_TUNE, struct.pack(">HIH", 2047, frame_max, 60)))
        got["after"] = s.recv(65536)
        return True

    def run():
        done = False
        while not done:
            try:
                s, _ = lst.accept()
            except OSError:
                return
            s.settimeout(10)
            try:
                done = serve(s)
            except OSError:
                pass
            finally:
                s.close()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return lst, t, got


def test_broker_frame_max_below_the_offer():
    lst, t, got = fake_broker(4096)
    r = Routed({VHOST: ["%s:%d" % lst.getsockname()]})
    try:
        c = w.RawClient(r.port)
        with pytest.raises(AssertionError) as e:
            c.handshake(vhost=VHOST)
        assert "530" in str(e.value) and "frame_max (4096)" in str(e.value)
        c.close_socket()
        t.join(10)
        # The client's own start-ok was what the broker got (the proxy's
        # probe came first, and went after connection.start).
        assert b"acemq-it-raw" in got["start_ok"]
        assert got["probes"] == 1
        assert "the broker's frame_max (4096) is below" in r.proxy.log_text()
    finally:
        r.stop()
        lst.close()


def test_handshake_out_of_order(routed):
    """The proxy greets: an out-of-order handshake is the proxy's to refuse."""
    c = w.RawClient(routed.port)
    try:
        c.send(w.PROTOCOL_HEADER)
        c.expect(w.CONNECTION_START, 0)
        c.send(w.method_frame(0, w.CONNECTION_OPEN, w.shortstr(VHOST) + w.shortstr("") + b"\x00"))
        f = c.read_frame()
        assert f.method == w.CONNECTION_CLOSE
        close = w.parse_connection_close(f.args)
        assert close["reply_code"] == 503, close
    finally:
        c.close_socket()


def test_other_mechanism_refused(routed):
    c = w.RawClient(routed.port)
    try:
        c.send(w.PROTOCOL_HEADER)
        f = c.expect(w.CONNECTION_START, 0)
        assert w.parse_connection_start(f.args)["mechanisms"] == b"PLAIN AMQPLAIN"
        c.send(w.method_frame(0, w.CONNECTION_START_OK, w.table({}) + w.shortstr("EXTERNAL") +
                              w.longstr(b"") + w.shortstr("en_US")))
        f = c.read_frame()
        assert f.method == w.CONNECTION_CLOSE
        assert w.parse_connection_close(f.args)["reply_code"] == 503
    finally:
        c.close_socket()


def test_client_leaves_while_the_broker_is_reached(node_b):
    """A client that goes between its open and the broker's open-ok, at
    every point, leaves nothing behind (the proxy keeps serving)."""
    lst, fillers = support.silent_listener()
    r = Routed({VHOST: ["%s:%d" % lst.getsockname(), "127.0.0.1:%d" % node_b]},
               ["--connect-timeout-ms", "500"])
    try:
        for _ in range(5):
            c = w.RawClient(r.port)
            c.send(w.PROTOCOL_HEADER)
            c.expect(w.CONNECTION_START, 0)
            response = b"\x00guest\x00guest"
            c.send(w.method_frame(0, w.CONNECTION_START_OK, w.table({}) + w.shortstr("PLAIN") +
                                  w.longstr(response) + w.shortstr("en_US")))
            c.expect(w.CONNECTION_TUNE, 0)
            c.send(w.method_frame(0, w.CONNECTION_TUNE_OK, struct.pack(">HIH", 2047, 131072, 0)))
            c.send(w.method_frame(0, w.CONNECTION_OPEN, w.shortstr(VHOST) + w.shortstr("") + b"\x00"))
            c.close_socket()
        time.sleep(1.0)
        q = support.unique_name("vb")
        round_trip(r.port, VHOST, q)
        ctl_b("delete_queue", "-p", VHOST, q, check=False)
        assert r.proxy.alive()
    finally:
        r.stop()
        for f in fillers:
            f.close()
        lst.close()


def tool(name, port, *args):
    return subprocess.run([name, "--server", support.HOST, "--port", str(port), "--vhost", VHOST,
                           "--username", "guest", "--password", "guest"] + list(args),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)


def test_rabbitmq_c_tools_through_the_greeting(routed):
    """rabbitmq-c (amqp-tools) through a greeted connection, to node B."""
    q = support.unique_name("vb")
    try:
        p = tool("amqp-declare-queue", routed.port, "-q", q)
        assert p.returncode == 0, p.stderr
        p = tool("amqp-publish", routed.port, "-r", q, "-b", "from amqp-publish")
        assert p.returncode == 0, p.stderr
        p = tool("amqp-get", routed.port, "-q", q)
        assert p.returncode == 0 and p.stdout == b"from amqp-publish", p
        assert q in queues(VHOST, NODE)
    finally:
        ctl_b("delete_queue", "-p", VHOST, q, check=False)


def test_rules_reload_adds_a_vhost_list(node_b):
    """Lists come and go with the rules: a reload that names the vhost's
    broker routes the next connections there."""
    r = Routed({"acemq-unused": ["127.0.0.1:%d" % support.BROKER_PORT]})
    q = support.unique_name("vb")
    try:
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            support.connect(r.port, virtual_host=VHOST)  # not on the main broker
        with open(os.path.join(r.dir, "z.json"), "w") as f:
            json.dump({"vhost": VHOST, "upstream": ["127.0.0.1:%d" % node_b]}, f)
        r.proxy.proc.send_signal(1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "rules: 2 vhosts" not in r.proxy.log_text():
            time.sleep(0.1)
        round_trip(r.port, VHOST, q)
    finally:
        ctl_b("delete_queue", "-p", VHOST, q, check=False)
        r.stop()


def test_bad_upstream_in_rules_refused(node_b):
    d = tempfile.mkdtemp(prefix="acemq-vb-bad-")
    try:
        for body, why in (({"vhost": "x", "upstream": []}, "non-empty array"),
                          ({"vhost": "x", "upstream": ["no-port"]}, "not HOST:PORT"),
                          ({"vhost": "x", "upstream": ["a.invalid:5672"]}, "cannot resolve"),
                          ({"vhost": "x", "upstream": ["127.0.0.1:1", "127.0.0.1:1"]}, "named twice")):
            with open(os.path.join(d, "x.json"), "w") as f:
                json.dump(body, f)
            p = subprocess.run([PROXY_BIN, "--rules", d, "--check-config"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, universal_newlines=True, timeout=30)
            assert p.returncode != 0
            assert "upstream" in p.stderr and why in p.stderr, p.stderr
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_engine_uses_the_vhosts_broker(node_b):
    """The proxy's own connection for a vhost (here: the scheduler's) goes
    to the vhost's brokers too: the ladder is declared on node B, and a
    delayed publish comes out there."""
    d = tempfile.mkdtemp(prefix="acemq-vb-sched-")
    with open(os.path.join(d, "v.json"), "w") as f:
        json.dump({"vhost": VHOST, "upstream": ["127.0.0.1:%d" % node_b],
                   "schedule": {"match": [{"exchange": ""}], "engine": True}}, f)
    admin = support.free_port()
    p = ProxyProcess("acemq-proxy-vb-sched", PROXY_BIN, support.BROKER_PORT,
                     extra_args=["--rules", d, "--data-dir", os.path.join(d, "data"),
                                 "--admin", "127.0.0.1:%d" % admin,
                                 "--engine-user", "guest", "--engine-password", "guest"])
    p.start()
    q = support.unique_name("vb")
    try:
        conn = support.connect(p.listen_port, virtual_host=VHOST)
        ch = conn.channel()
        ch.queue_declare(q)
        ch.confirm_delivery()
        t0 = time.monotonic()
        ch.basic_publish("", q, b"later, on node B",
                         pika.BasicProperties(headers={"x-delay": 1000}))
        got = None
        while got is None and time.monotonic() - t0 < 20:
            got = ch.basic_get(q, auto_ack=True)[2]
            if got is None:
                conn.sleep(0.1)
        conn.close()
        assert got == b"later, on node B"
        assert time.monotonic() - t0 >= 1.0
        exchanges = ctl_b("list_exchanges", "-p", VHOST, "name", "--no-table-headers").stdout.split()
        assert "acemq.schedule" in exchanges
    finally:
        p.stop()
        ctl_b("delete_queue", "-p", VHOST, q, check=False)
        for name in ("acemq.schedule.1h", "acemq.schedule.10m", "acemq.schedule.1m",
                     "acemq.schedule.10s", "acemq.schedule.1s", "acemq.schedule.due"):
            ctl_b("delete_queue", "-p", VHOST, name, check=False)
        shutil.rmtree(d, ignore_errors=True)
