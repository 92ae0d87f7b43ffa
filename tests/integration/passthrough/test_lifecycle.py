"""Connection lifecycle: forced closes, vanished clients, SIGTERM."""

import signal
import socket
import struct
import time

import pika
import pika.exceptions
import pytest

import amqp_wire as wire
import support


def find_broker_connection(name, timeout=10):
    """pid of the broker-side connection whose client_properties carry name."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = support.rabbitmqctl("list_connections", "pid", "client_properties", "--no-table-headers").stdout
        for line in out.splitlines():
            if '"%s"' % name in line:
                return line.split("\t")[0]
        time.sleep(0.2)
    return None


def test_forced_close_relayed(endpoint, connections):
    """rabbitmqctl close_connection reaches the client as connection.close 320
    with the broker's text; the client's properties reach the broker."""
    name = support.unique_name("acemq-it-forced")
    conn = connections(endpoint.port, client_properties={"connection_name": name})
    conn.channel()
    pid = find_broker_connection(name)
    assert pid, "broker does not list a connection named %s" % name
    support.rabbitmqctl("close_connection", pid, "acemq-it says goodbye")
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as exc:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            conn.process_data_events(0.2)
    assert exc.value.reply_code == 320
    assert exc.value.reply_text == "CONNECTION_FORCED - acemq-it says goodbye"


def raw_consume(c, channel, queue, no_ack=False):
    args = (struct.pack(">H", 0) + wire.shortstr(queue) + wire.shortstr("")
            + struct.pack(">B", 2 if no_ack else 0) + wire.table({}))
    c.send(wire.method_frame(channel, (60, 20), args))
    c.expect((60, 21), channel)


def test_vanished_client_releases_unacked(endpoint, new_queue, connections):
    """A client that drops its TCP connection (RST, no connection.close) with
    an unacked delivery: the broker requeues it and forgets the consumer."""
    queue = new_queue("acemq-it-vanish")
    pub = connections(support.BROKER_PORT).channel()
    pub.confirm_delivery()
    pub.basic_publish("", queue, b"unacked")
    c = wire.RawClient(endpoint.port).handshake()
    try:
        c.channel_open(1)
        raw_consume(c, 1, queue)
        f = c.read_frame()
        assert f.method == (60, 60), f  # basic.deliver
        assert support.queue_depth(support.BROKER_PORT, queue) == (0, 1)
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        c.close_socket()
    ok = support.wait_until(lambda: support.queue_depth(support.BROKER_PORT, queue) == (1, 0), 10, interval=0.1)
    assert ok, support.queue_depth(support.BROKER_PORT, queue)
    method, _, body = pub.basic_get(queue, auto_ack=True)
    assert body == b"unacked" and method.redelivered is True


def broker_connection_names():
    out = support.rabbitmqctl("list_connections", "client_properties", "--no-table-headers").stdout
    return out


def test_client_gone_mid_message(endpoint, new_queue, connections):
    """A client that disappears half way through a content body: nothing is
    enqueued and the broker side connection goes away."""
    queue = new_queue("acemq-it-vanish")
    name = support.unique_name("acemq-it-half")
    c = wire.RawClient(endpoint.port)
    try:
        c.handshake(client_properties={"connection_name": name})
        c.channel_open(1)
        data = wire.publish_frames(1, queue, b"x" * 100000, c.frame_max)
        c.send(data[:len(data) // 2])
        assert find_broker_connection(name), "broker does not list %s" % name
    finally:
        c.close_socket()
    assert support.wait_until(lambda: '"%s"' % name not in broker_connection_names(), 10, interval=0.2), \
        "broker still has the connection of a client that went away"
    assert support.queue_depth(support.BROKER_PORT, queue) == (0, 0)
    # a following client on the same path works
    ch = connections(endpoint.port).channel()
    assert ch.queue_declare(queue, passive=True).method.message_count == 0


def wait_refused(port, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            s = socket.create_connection((support.HOST, port), timeout=0.5)
        except OSError:
            return True
        s.close()
        time.sleep(0.05)
    return False


def test_sigterm_drains_then_closes_320(spawn_proxy, new_queue):
    queue = new_queue("acemq-it-term")
    p = spawn_proxy(name="acemq-proxy-term", extra_args=["--drain-timeout-ms", "2000"])
    conn = support.connect(p.listen_port)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", queue, b"before term")
        t0 = time.monotonic()
        p.signal(signal.SIGTERM)
        # no new connections once the drain started
        assert wait_refused(p.listen_port, 3), "proxy still accepts connections after SIGTERM"
        # the existing connection keeps working during the drain
        ch.basic_publish("", queue, b"during drain")
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as exc:
            while time.monotonic() - t0 < 15:
                conn.process_data_events(0.1)
        elapsed = time.monotonic() - t0
        assert exc.value.reply_code == 320, exc.value
        assert 1.0 <= elapsed <= 6.0, "closed %.2f s after SIGTERM with a 2 s drain" % elapsed
    finally:
        support.safe_close(conn)
    try:
        code = p.proc.wait(10)
    except Exception:
        pytest.fail("proxy still running 10 s after the drain ended\n" + p.log_tail())
    assert code == 0, "exit status %s\n%s" % (code, p.log_tail())
    assert [b for _, b in support.drain(support.BROKER_PORT, queue)] == [b"before term", b"during drain"]


def test_sigterm_exits_once_clients_are_gone(spawn_proxy):
    p = spawn_proxy(name="acemq-proxy-term")  # default drain timeout (10 s)
    conn = support.connect(p.listen_port)
    conn.channel()
    t0 = time.monotonic()
    p.signal(signal.SIGTERM)
    conn.process_data_events(0.5)
    conn.close()  # the last client leaves on its own
    try:
        code = p.proc.wait(5)
    except Exception:
        pytest.fail("proxy did not exit after its last client left\n" + p.log_tail())
    assert code == 0
    assert time.monotonic() - t0 < 6


def test_sigterm_idle_exits_promptly(spawn_proxy):
    p = spawn_proxy(name="acemq-proxy-term")
    t0 = time.monotonic()
    p.signal(signal.SIGTERM)
    assert p.proc.wait(5) == 0
    assert time.monotonic() - t0 < 5
